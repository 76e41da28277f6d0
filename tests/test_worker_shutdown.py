"""A worker whose Redis is gone still stops on SIGTERM within its shutdown grace, even with a
finished micro-batch it cannot write back, and logs the outage once rather than once per retry
(issue 18 finding 5, issue 16 item 6); one whose engine call outlasts the grace still exits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import redis

from conveyor.stack import Stack
from shared.keys import GROUP, Keys
from tests.conftest import REPO_ROOT, running_stack, until

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"
GRACE_S = 3
# Past the grace, what Celery's exit gets before the worker forces its own (20 s by default):
# short here, where only the forced exit ends the worker at all (the engine call in hand holds
# Celery's own exit for a minute), so the test does not sit out a longer one.
FORCED_EXIT_MARGIN_S = 2
ENGINE_S = 2.0  # the job in hand outlives Redis: its write-back meets the outage
# Long enough for a backoff that logged every retry (0.1 s doubling to a 5 s cap, jitter only
# shortening a sleep) to have logged four more lines at least, past the three warnings allowed,
# even in the write-back's loop, whose outage starts when the job ends (up to ENGINE_S later):
# the outage's length is the scenario here, not a synchronisation.
OUTAGE_S = 4.0


def _worker_warnings(log: Path) -> list[dict[str, Any]]:
    """Warning-or-worse lines that Conveyor's worker code (not Celery: not JSON) logged."""
    records = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return [
        record
        for record in records
        if isinstance(record, dict)
        and str(record.get("name", "")).startswith("workers.")
        and record.get("level") in ("WARNING", "ERROR")
    ]


@contextlib.contextmanager
def _running_a_job(
    tmp_path: Path, sleep_ms: int, grace_s: float = GRACE_S, **env: str
) -> Iterator[tuple[Any, str, redis.Redis]]:
    """A stack whose `faulty` worker (shutdown grace `grace_s`, settings `env`) runs a
    job that sleeps `sleep_ms`: the stack, the job's id, and a client of its Redis (closed
    after)."""
    with running_stack(
        tmp_path,
        workers=("faulty",),
        CONVEYOR_MODEL_REPOSITORY=str(FIXTURES),
        PYTHONPATH=str(REPO_ROOT),  # the custom backend lives in tests/
        CONVEYOR_AUTH="disabled",
        CONVEYOR_SHUTDOWN_GRACE_S=str(grace_s),
        **env,
    ) as pipeline:
        body = {"model": "faulty", "inputs": {"sleep_ms": sleep_ms}}
        job_id = httpx.post(f"{pipeline.base_url}/v1/jobs", json=body).json()["id"]
        client = redis.Redis.from_url(pipeline.redis_url, decode_responses=True)
        try:
            until(lambda: client.hget(Keys().job(job_id), "status") == "running")
            yield pipeline, job_id, client
        finally:
            client.close()


def test_worker_exits_on_sigterm_while_redis_is_gone(tmp_path: Path) -> None:
    with _running_a_job(tmp_path, int(ENGINE_S * 1000)) as (pipeline, _, _):
        worker = pipeline.processes["faulty"]
        log = tmp_path / "faulty.log"
        pipeline.stop_process("valkey")
        until(lambda: "redis unavailable" in log.read_text(), timeout=ENGINE_S + 30)
        time.sleep(OUTAGE_S)
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=GRACE_S + 10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after SIGTERM; see {log}") from None
        assert "consumer did not drain" not in log.read_text(), "a loop ignored the stop"
        warnings = _worker_warnings(log)
        assert len(warnings) in range(1, 4), warnings


def test_worker_exits_after_its_grace_with_an_engine_call_that_outlasts_it(
    tmp_path: Path,
) -> None:
    """Engine calls run on pool threads, which Python waits for at exit: after SIGTERM the
    worker gave up its drain at the grace, then lingered until the call returned (here in a
    minute). Its exit is forced shortly after the grace now; the job stays pending for reclaim.
    A grace of 1 s: the forced exit comes CONVEYOR_FORCED_EXIT_MARGIN_S (2 s here) after it."""
    grace_s = 1
    margin = {"CONVEYOR_FORCED_EXIT_MARGIN_S": str(FORCED_EXIT_MARGIN_S)}
    with _running_a_job(tmp_path, 60_000, grace_s, **margin) as (pipeline, job_id, client):
        worker = pipeline.processes["faulty"]
        worker.send_signal(signal.SIGTERM)
        try:  # a bound, not a measured duration: the call in hand would hold it a minute
            # (as long a bound as when the margin here was 5 s)
            code = worker.wait(timeout=grace_s + FORCED_EXIT_MARGIN_S + 13)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after SIGTERM; see {tmp_path}") from None
        assert code == os.EX_SOFTWARE
        stream = Keys().queue("faulty", "default")
        consumer = pipeline.consumer_name(worker.pid)
        assert len(client.xpending_range(stream, GROUP, "-", "+", 10, consumer)) == 1
        assert client.hget(Keys().job(job_id), "status") == "running"


def test_an_idle_worker_stops_at_once_whatever_its_block_and_grace(tmp_path: Path) -> None:
    """A stop ends the blocking read of an idle worker: it waited the read out (CONVEYOR_BLOCK_MS,
    20 s here), past a shorter grace, and logged that it did not drain with nothing in hand. A
    Valkey of its own, no producer: nothing else reads or counts the partition's consumers."""
    stack = Stack.create(tmp_path)
    try:
        pid = stack.start_worker(
            "identity:default",
            name="idle",
            CONVEYOR_BLOCK_MS="20000",
            # a grace well short of the block, yet not so short that a stop slowed by a loaded
            # machine outlasts it: at 1 s such a stop logged "did not drain" all the same
            CONVEYOR_SHUTDOWN_GRACE_S="5",
            CONVEYOR_FORCED_EXIT_MARGIN_S="3",
        )
        with contextlib.closing(stack.client()) as client:
            until(lambda: _blocked_reading(client, stack.consumer_name(pid)))
        assert stack.stop_process("idle") == 0, stack.log_tail("idle")
        assert "consumer did not drain" not in stack.log_path("idle").read_text(errors="replace")
    finally:
        stack.stop()


def _blocked_reading(client: redis.Redis, consumer: str) -> bool:
    """Whether a connection of `consumer` waits in its blocking XREADGROUP now."""
    return any(
        c["name"] == consumer and c["cmd"] == "xreadgroup" and "b" in c["flags"]
        for c in client.client_list()
    )

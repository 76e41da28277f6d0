"""`conveyor autoscale` on a real pipeline: a burst scales the pool up to its max, an empty
queue scales it back to zero after the cooldown, every job succeeds."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from conveyor.stack import Stack
from shared.keys import Keys
from tests.conftest import REPO_ROOT, running_stack, until

KEYS = Keys("cv:")

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"
AUTOSCALE = [str(Path(sys.executable).parent / "conveyor"), "autoscale", "--models", "elastic"]
pytestmark = pytest.mark.slow


@pytest.fixture
def elastic_stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(
        tmp_path / "stack",
        CONVEYOR_MODEL_REPOSITORY=str(FIXTURES),
        PYTHONPATH=str(REPO_ROOT),
        CONVEYOR_AUTH="disabled",
    ) as stack:
        yield stack


def _autoscaler(
    env: dict[str, str], state_dir: Path, interval: str
) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    """`conveyor autoscale` of the elastic pool, and its output (stderr too), line by line."""
    process = subprocess.Popen(
        [*AUTOSCALE, "--interval", interval, "--state-dir", str(state_dir)],
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, _lines(process)


def _lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.strip())

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for(
    lines: queue.Queue[str], wanted: str, timeout: float, prefix: bool = False
) -> list[str]:
    """Lines up to the first that is `wanted` (or, with `prefix`, starts with it)."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        if line == wanted or (prefix and line.startswith(wanted)):
            return seen
    raise AssertionError(f"never saw {wanted!r}; last lines: {seen[-5:]}")


async def _burst(base_url: str, count: int) -> list[str]:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        responses = await asyncio.gather(
            *(
                client.post("/v1/jobs", json={"model": "elastic", "inputs": {"sleep_ms": 400}})
                for _ in range(count)
            )
        )
    bad = [r for r in responses if r.status_code != 202]
    assert not bad, bad[0].text
    return [r.json()["id"] for r in responses]


def test_burst_scales_up_then_idle_scales_to_zero(elastic_stack: Stack, tmp_path: Path) -> None:
    process, lines = _autoscaler(elastic_stack.env, tmp_path / "scaler", "0.5")
    try:
        _wait_for(lines, "elastic:default replicas=0", timeout=60)
        ids = asyncio.run(_burst(elastic_stack.base_url, 200))
        _wait_for(lines, "elastic:default replicas=3", timeout=120)
        client = redis.Redis.from_url(elastic_stack.redis_url, decode_responses=True)
        until(lambda: all(client.hget(KEYS.job(i), "status") == "succeeded" for i in ids), 120)
        workers = {client.hget(KEYS.job(i), "worker") for i in ids}
        assert len(workers) > 1
        after = _wait_for(lines, "elastic:default replicas=0", timeout=120)
        assert "elastic:default replicas=2" in after and "elastic:default replicas=1" in after
        client.close()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def test_a_worker_that_dies_is_replaced(elastic_stack: Stack, tmp_path: Path) -> None:
    """Nothing looked at whether a worker it started still ran: one killed (for memory, by a
    crash) went on counting, the formula saw its replicas all there, and the pool stayed short
    for good. Now the next poll says so and starts another, as Kubernetes restarts a pod."""
    process, lines = _autoscaler(elastic_stack.env, tmp_path / "scaler", "0.5")
    client = redis.Redis.from_url(elastic_stack.redis_url, decode_responses=True)
    try:
        _wait_for(lines, "elastic:default replicas=0", timeout=60)
        ids = asyncio.run(_burst(elastic_stack.base_url, 600))
        _wait_for(lines, "elastic:default replicas=3", timeout=120)
        victim = until(
            lambda: next(filter(None, (client.hget(KEYS.job(i), "worker") for i in ids)), None)
        )
        os.kill(int(victim.rsplit("-", 1)[1]), signal.SIGKILL)
        _wait_for(lines, "elastic:default: worker", timeout=30, prefix=True)
        # the three, and the one that replaced the dead one, took jobs (the dead one's are
        # reclaimed after the visibility timeout, as ever)
        until(lambda: len({client.hget(KEYS.job(i), "worker") for i in ids} - {None}) >= 4, 60)
    finally:
        client.close()
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def test_a_redis_outage_keeps_the_pools_as_they_are(tmp_path: Path) -> None:
    """A poll that found Redis gone raised out of the loop: the autoscaler died, and stopped
    every worker it had started on its way out. Now it says so and polls again. (An
    unreachable Redis at start is one clear error.)"""
    refused = subprocess.run(
        [*AUTOSCALE, "--state-dir", str(tmp_path / "refused")],
        env={
            **os.environ,
            "CONVEYOR_REDIS_URL": "redis://127.0.0.1:1/0",
            "CONVEYOR_MODEL_REPOSITORY": str(FIXTURES),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "Error: cannot reach Redis at" in refused.stderr
    mine = Stack.create(tmp_path / "stack")
    env = {**mine.env, "CONVEYOR_MODEL_REPOSITORY": str(FIXTURES)}
    process, lines = _autoscaler(env, tmp_path / "scaler", "0.2")
    try:
        _wait_for(lines, "elastic:default replicas=0", timeout=60)
        mine.restart_valkey(down_s=1.0)
        _wait_for(lines, "elastic:default: redis unavailable (", timeout=30, prefix=True)
        _wait_for(lines, "elastic:default replicas=0", timeout=30)  # polling on, after it
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
        mine.stop()


def test_a_worker_slower_than_the_start_timeout_is_reported(
    elastic_stack: Stack, tmp_path: Path
) -> None:
    """CONVEYOR_START_TIMEOUT_S bounds a scale-up's start, as `conveyor up`'s: the autoscaler
    waited 300 s whatever was set, and then named the setting it had ignored."""
    env = {**elastic_stack.env, "CONVEYOR_START_TIMEOUT_S": "0.05"}
    process, lines = _autoscaler(env, tmp_path / "scaler", "0.5")
    try:
        _wait_for(lines, "elastic:default replicas=0", timeout=60)
        asyncio.run(_burst(elastic_stack.base_url, 20))
        [*_, failed] = _wait_for(lines, "elastic:default: a worker did not start", 60, True)
        assert "not ready after 0.05s (CONVEYOR_START_TIMEOUT_S)" in failed, failed
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)

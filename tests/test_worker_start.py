"""A worker refuses at start what would leave it serving nothing while it looks healthy; one
whose partition loop fails stops the others before it closes their engines. Its wait for its
engines follows CONVEYOR_START_TIMEOUT_S and gives way to SIGTERM; a metrics port in use stops
it before it reads."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from conveyor.stack import Stack
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfigError
from shared.settings import Settings
from tests.conftest import REPO_ROOT, running_stack, until
from workers.runtime.consumer_runtime import (
    MIN_START_WAIT_S,
    ConsumerRuntime,
    run_together,
    start_wait_s,
)

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"


def test_a_worker_told_to_serve_nothing_refuses_to_start() -> None:
    """Without CONVEYOR_MODELS a worker used to start, idle and report itself alive."""
    with pytest.raises(ModelConfigError, match=r"^CONVEYOR_MODELS is empty: name what this worker"):
        ConsumerRuntime(Settings(models=[]))
    with pytest.raises(ModelConfigError, match=r"^unknown model 'minlm'"):
        ConsumerRuntime(Settings(models=["minlm"]))


class _Loop:
    """A partition loop's contract with the runtime: `run` until `stopping` is set."""

    def __init__(self, fails: bool) -> None:
        self.stopping = asyncio.Event()
        self.fails = fails
        self.ran_to_its_stop = False

    async def run(self) -> None:
        if self.fails:
            await asyncio.sleep(0.01)
            raise RuntimeError("the engine died")
        await self.stopping.wait()
        await asyncio.sleep(0.01)  # the micro-batch in hand is written back
        self.ran_to_its_stop = True


async def test_a_loop_that_fails_stops_the_others_before_the_runtime_closes_anything() -> None:
    """asyncio.gather raised at the first failure and the engines were closed while the other
    partitions' loops ran on: their jobs failed with the closed engines' errors."""
    others, failing = [_Loop(False), _Loop(False)], _Loop(True)
    with pytest.raises(RuntimeError, match="the engine died"):
        await run_together([others[0], failing, others[1]])
    assert all(loop.ran_to_its_stop for loop in others)


def test_a_worker_waits_for_its_engines_as_long_as_the_start_timeout_allows() -> None:
    """The worker's own wait was a fixed 600 s: raising CONVEYOR_START_TIMEOUT_S for a large
    LLM's load let `conveyor up` wait longer, and the worker gave up at 600 s all the same."""
    assert start_wait_s(Settings(start_timeout_s=1_800)) == 1_800
    assert start_wait_s(Settings(start_timeout_s=30)) == MIN_START_WAIT_S


@pytest.mark.slow
def test_sigterm_while_the_engines_load_stops_the_worker(tmp_path: Path, redis_url: str) -> None:
    """The worker waited for its engines without a look at Celery's stop flag: SIGTERM during a
    long load was honoured only once the load ended (here in ten minutes)."""
    (tmp_path / "repository" / "slow").mkdir(parents=True)
    (tmp_path / "repository" / "slow" / "config.yaml").write_text(
        "kind: generate\nbackend: tests.paced_engine:PacedEngine\nparameters: {load_ms: 600000}\n"
    )
    stack = Stack.create(tmp_path, redis_url)
    try:
        name = stack.spawn_worker(
            "slow",
            CONVEYOR_MODEL_REPOSITORY=str(tmp_path / "repository"),
            PYTHONPATH=str(REPO_ROOT),  # the engine lives in tests/
        )
        worker = stack.processes[name]
        heartbeat = Keys().worker(stack.consumer_name(worker.pid))
        client = stack.client()
        until(lambda: client.exists(heartbeat), timeout=120)  # Celery's signal handlers are set
        client.close()
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still loading after SIGTERM; see {tmp_path}") from None
        assert code == 0, f"see {tmp_path}/{name}.log"
    finally:
        stack.stop()


@pytest.mark.slow
def test_a_metrics_port_in_use_stops_the_worker_before_it_reads(tmp_path: Path) -> None:
    """The metrics server bound its port only once the consumer read: a port in use stopped the
    worker then, and Celery, not fully started, stopped none of its steps, so the micro-batch it
    had read stayed pending a visibility timeout, and cost each of its jobs a delivery."""
    with (
        socket.create_server(("0.0.0.0", 0)) as taken,
        running_stack(
            tmp_path,
            CONVEYOR_MODEL_REPOSITORY=str(FIXTURES),
            PYTHONPATH=str(REPO_ROOT),  # the engine lives in tests/
            CONVEYOR_AUTH="disabled",
        ) as stack,
    ):
        body = {"model": "faulty", "inputs": {"sleep_ms": 600_000}}
        for _ in range(3):
            assert httpx.post(f"{stack.base_url}/v1/jobs", json=body).status_code == 202
        port = taken.getsockname()[1]
        name = stack.spawn_worker("faulty", name="worker", CONVEYOR_METRICS_PORT=str(port))
        worker = stack.processes[name]
        try:
            code = worker.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running; see {tmp_path}/worker.log") from None
        assert code != 0
        assert f"CONVEYOR_METRICS_PORT={port}" in (tmp_path / "worker.log").read_text()
        client = stack.client()
        stream = Keys().queue("faulty", "default")
        consumer = stack.consumer_name(worker.pid)
        assert client.xpending_range(stream, GROUP, "-", "+", 10, consumer) == []
        client.close()

"""The producer's process ends when it should: one that cannot bind its port exits non-zero
(it used to hang in "Waiting for application shutdown", its background loops never ending), and
SIGTERM stops it within its shutdown timeout even while its Redis is gone."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import httpx

from conveyor.stack import Stack
from shared.settings import Settings
from tests.conftest import running_stack, until

# From the bind error to the exit: the lifespan's shutdown plus the interpreter's teardown,
# which take about a second on an idle machine (the bug was an endless wait).
BIND_EXIT_S = 10.0


def _spawn_producer(stack: Stack, port: int, name: str) -> subprocess.Popen[bytes]:
    """A producer on `port` without waiting for it to be ready (it may never be)."""
    stack.start_producer_process(port, name)
    return stack.processes[name]


def test_producer_that_cannot_bind_exits_non_zero(stack: Stack) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = _spawn_producer(stack, port, "producer-port-taken")
        log = stack.log_dir / "producer-port-taken.log"
        until(lambda: "address already in use" in log.read_text(), timeout=120)
        try:
            assert process.wait(timeout=BIND_EXIT_S) != 0
        finally:
            stack.stop_process("producer-port-taken", sig=signal.SIGKILL)


def test_sigterm_stops_producer_while_redis_is_gone(tmp_path: Path) -> None:
    with running_stack(tmp_path, CONVEYOR_AUTH="disabled") as pipeline:
        producer = pipeline.processes["producer"]
        pipeline.stop_process("valkey")
        until(lambda: _unready(pipeline.base_url))
        producer.send_signal(signal.SIGTERM)
        producer.wait(timeout=Settings().shutdown_grace_s)  # raises if it is still running
        log = (tmp_path / "producer.log").read_text()
        assert "Application shutdown complete" in log


def _unready(base_url: str) -> bool:
    return httpx.get(f"{base_url}/readyz", timeout=5).status_code == 503

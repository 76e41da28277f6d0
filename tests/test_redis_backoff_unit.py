"""Stack-free: a Redis outage is two log lines however many retries it takes, and a loop asked
to stop while Redis is gone gives up its write (the entry stays pending for reclaim)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from workers.partition.redis_backoff import OutageLog, Stopped, until_done


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_outage_logs_when_it_starts_and_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="workers.partition.redis_backoff")
    outage = OutageLog("m:default")
    for _ in range(50):
        outage.failed(RedisConnectionError("refused"))
    outage.recovered()
    outage.recovered()  # answering while up logs nothing
    warnings = _warnings(caplog)
    assert len(warnings) == 2, warnings
    assert "m:default: redis unavailable (refused)" in warnings[0]
    assert "m:default: redis reachable again" in warnings[1]


def test_each_outage_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    outage = OutageLog("heartbeat")
    for _ in range(3):
        outage.failed(RedisConnectionError("down"))
        outage.failed(RedisConnectionError("down"))
        outage.recovered()
    assert len(_warnings(caplog)) == 6


async def test_a_write_retries_through_an_outage() -> None:
    attempts = 0

    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise RedisConnectionError("down")
        return "written"

    assert await until_done(flaky, asyncio.Event(), "m:default") == "written"
    assert attempts == 3


async def test_asked_to_stop_while_redis_is_gone_the_write_gives_up() -> None:
    stop = asyncio.Event()
    attempts = 0

    async def unreachable() -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 2:
            stop.set()  # SIGTERM arrives during the outage
        raise RedisConnectionError("down")

    with pytest.raises(Stopped):
        await until_done(unreachable, stop, "m:default")
    assert attempts == 2

"""Stack-free: a Redis outage is two log lines however many retries it takes (a Celery
broker's too), and a loop asked to stop while Redis is gone gives up its write (the entry stays
pending for reclaim)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from celery.worker.consumer.consumer import CONNECTION_ERROR, CONNECTION_RETRY
from redis.exceptions import ConnectionError as RedisConnectionError

from workers.partition.redis_backoff import Backoff, OutageLog, Stopped, until_done
from workers.runtime.broker_outage_log import (
    CONNECTED,
    CONNECTION_LOGGER,
    CONSUMER_LOGGER,
    FREQUENT_RESTARTS,
    KOMBU_LOGGER,
    REFRESH_REFUSED,
    REFRESH_SPELL_GAP_S,
    BrokerOutageLog,
)


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


def test_a_broker_outage_is_two_lines_of_celerys_log() -> None:
    """Celery's consumer restarting against a broker that refuses writes: the spell's first
    error passes, the restarts after it are DEBUG (dropped here), and the next "Connected to"
    says how long the broker was away and how many restarts were not shown."""
    outage_log = BrokerOutageLog()

    def record(name: str, msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)

    errors = [
        record(CONSUMER_LOGGER, CONNECTION_ERROR, "redis://", "READONLY", ""),
        record(CONSUMER_LOGGER, "%s (%r)", CONNECTION_RETRY, "READONLY"),
        record(CONSUMER_LOGGER, FREQUENT_RESTARTS, 3),
    ]
    connected = record(CONNECTION_LOGGER, CONNECTED, "redis://")
    assert [outage_log.filter(each) for each in errors] == [True, False, False]
    assert [each.levelno for each in errors] == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    assert outage_log.filter(connected) and connected.levelno == logging.WARNING
    assert connected.getMessage().startswith("Connected to redis:// again after 0.")
    assert connected.getMessage().endswith("s (2 more connection errors logged at DEBUG)")
    # once connected, the next error starts a new spell; "Connected to" alone is left as it is
    again = record(CONNECTION_LOGGER, CONNECTED, "redis://")
    assert outage_log.filter(again) and again.getMessage() == "Connected to redis://"
    assert outage_log.filter(record(CONSUMER_LOGGER, CONNECTION_ERROR, "redis://", "x", ""))


def test_a_spell_of_refused_binding_refreshes_is_one_line_of_kombus_log() -> None:
    """A full (noeviction) server refuses kombu's binding refresh while its connection stays
    up: kombu logged a WARNING with its traceback on every turn of its loop, a second apart, for
    as long as the server was full. A spell's first passes; one after a gap starts a new spell."""
    now = [0.0]
    outage_log = BrokerOutageLog(clock=lambda: now[0])

    def refused(at: float) -> logging.LogRecord:
        now[0] = at
        return logging.LogRecord(
            KOMBU_LOGGER, logging.WARNING, __file__, 1, REFRESH_REFUSED, (), None
        )

    spell = [refused(at) for at in (0.0, 1.0, 2.0, 3.0)]
    assert [outage_log.filter(each) for each in spell] == [True, False, False, False]
    assert [each.levelno for each in spell] == [logging.WARNING] + [logging.DEBUG] * 3
    after_a_gap = refused(3.0 + REFRESH_SPELL_GAP_S + 1)
    assert outage_log.filter(after_a_gap) and after_a_gap.levelno == logging.WARNING


async def test_a_long_outage_keeps_backing_off_at_the_cap() -> None:
    """An hour at the 5 s cap is ~1,000 retries: 0.1 * 2**1024 overflowed a float, and the
    loop's worker exited mid-outage with its results in hand."""
    stop = asyncio.Event()
    stop.set()  # each sleep returns at once
    backoff = Backoff(stop, "m:default")
    for _ in range(1_100):
        await backoff.sleep(RedisConnectionError("down"))
    assert backoff.first_s * 2**backoff.attempt <= 2 * backoff.cap_s

"""A worker's clock judges jobs' deadlines and queue times: one running 11 minutes fast expired
every job it read, with nothing in its log to say why. The heartbeat's check against a real
Valkey's clock says so once, and once again when the clocks agree."""

from __future__ import annotations

import logging
import time

import pytest
import redis.asyncio as aioredis

from shared import redis_clock
from shared.redis_clock import ClockSkew

AHEAD_S = 660.0  # eleven minutes fast


async def test_a_host_clock_off_redis_is_warned_of_once_and_its_return_said(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = time.time
    caplog.set_level(logging.WARNING, logger=redis_clock.__name__)
    seldom = ClockSkew()
    assert abs(await seldom.check(aredis) or 0.0) < redis_clock.SKEW_WARN_S  # in step: silent
    assert await seldom.check(aredis) is None  # not due again for EVERY_S
    assert caplog.records == []

    skew = ClockSkew(every_s=0)
    monkeypatch.setattr(redis_clock.time, "time", lambda: real() + AHEAD_S)
    for _ in range(2):
        measured = await skew.check(aredis)
        assert measured is not None and abs(measured - AHEAD_S) < 1.0
    [warned] = caplog.records  # once a drift, not every check
    assert "+660" in warned.getMessage() and "NTP" in warned.getMessage()

    monkeypatch.setattr(redis_clock.time, "time", real)
    await skew.check(aredis)
    assert len(caplog.records) == 2 and "agrees" in caplog.records[1].getMessage()

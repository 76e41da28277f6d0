"""A host clock that sits at the warning's threshold (NTP-less, a second off) measured just above
it at one check and just below at the next: the log warned and took it back every minute, for
as long as the drift lasted. It takes it back once the clocks agree well within the threshold."""

from __future__ import annotations

import logging
import time

import pytest
import redis.asyncio as aioredis

from shared import redis_clock
from shared.redis_clock import ClockSkew


async def test_a_skew_about_the_threshold_is_warned_of_once(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = time.time
    caplog.set_level(logging.WARNING, logger=redis_clock.__name__)
    skew = ClockSkew(every_s=0)
    for off_s in (1.3, 0.8, 1.3, 0.8):  # either side of SKEW_WARN_S by more than a round trip
        monkeypatch.setattr(redis_clock.time, "time", lambda off_s=off_s: real() + off_s)
        await skew.check(aredis)
    [warned] = caplog.records
    assert "+1.3" in warned.getMessage()

    monkeypatch.setattr(redis_clock.time, "time", real)
    await skew.check(aredis)  # in step again: said once
    assert len(caplog.records) == 2 and "agrees" in caplog.records[1].getMessage()

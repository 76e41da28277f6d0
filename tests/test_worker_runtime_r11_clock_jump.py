"""The clock check against a real Valkey's TIME when the skew jumps while it is already off: a
failover to a Redis on another host, or either clock stepped by NTP."""

from __future__ import annotations

import logging
import time

import pytest
import redis.asyncio as aioredis

from shared import redis_clock
from shared.redis_clock import ClockSkew


async def test_a_skew_that_jumps_while_off_is_warned_of_again(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the first drift was told: a skew that went from 11 minutes ahead to 10 behind left
    the log saying jobs expire early, while they ran late."""
    real = time.time
    caplog.set_level(logging.WARNING, logger=redis_clock.__name__)
    skew = ClockSkew(every_s=0)
    for off_s in (660.0, 660.0, -600.0, -600.0):
        monkeypatch.setattr(redis_clock.time, "time", lambda off_s=off_s: real() + off_s)
        await skew.check(aredis)
    monkeypatch.setattr(redis_clock.time, "time", real)
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2, said  # once for each skew, not once a check
    assert "+660" in said[0] and "-600" in said[1]

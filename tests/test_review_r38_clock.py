"""A slow TIME does not move the process's clock (shared/redis_clock.py): on a real Valkey, a
host 0.5 s ahead of Redis's measures its skew, then measures again while its event loop stalls
(a busy producer's, whose `redis-clock` loop shares it with the requests): the reply is read
late, so the skew reads off by half the stall. It was adopted (0.8 s after a 0.6 s stall), and
every job stamped for the next 30 s was off by the error; the correction in force, which that
measure bears out within its uncertainty, stands."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from shared.redis_clock import CLOCK, ClockSkew
from tests.test_clock_r38_sweep import _read_off

AHEAD_S = 0.5
STALL_S = 0.6  # the loop held while TIME's reply waits: the measure's uncertainty, doubled


async def test_a_measure_during_a_stalled_loop_keeps_the_correction(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _read_off(monkeypatch, AHEAD_S)
    skew = ClockSkew(corrects=CLOCK)
    await skew.sync(aredis)
    adopted = CLOCK.skew_ns
    assert abs(adopted / 1e9 - AHEAD_S) < 0.2

    async def stall() -> None:
        await asyncio.sleep(0)  # once TIME is sent
        time.sleep(STALL_S)  # a blocking call on the loop, as a CPU-bound request's

    await asyncio.gather(skew.sync(aredis), stall())
    assert skew.skew_s is not None and skew.skew_s - AHEAD_S > 0.2  # read off by the stall
    assert CLOCK.skew_ns == adopted

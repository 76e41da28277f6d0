"""A key's token bucket on a real Valkey when Redis's clock and the bucket disagree. The bucket
keeps the ms of its last take; once Redis's clock stepped back (a failover to a replica whose
clock is behind), it refilled nothing until the clock caught up again, however often
Retry-After said a token was a second away. A bucket holding more than the burst (a lower
CONVEYOR_RATE_LIMIT_BURST rolled out beside replicas still taking at the old one) answered a
Remaining above its Limit and a negative Reset, and its PEXPIRE of that deleted it."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.job_store import now_ms
from shared.keys import Keys
from shared.rate_limit import Quota, RateLimiter

KEYS = Keys("rl-edges:")
HOUR_MS = 3_600_000


async def test_a_bucket_refills_after_redis_clock_stepped_back(aredis: aioredis.Redis) -> None:
    limiter = RateLimiter(aredis, KEYS)
    quota = Quota(rate_per_s=1_000.0, burst=1, max_in_flight=1, max_streams=1)
    # emptied an hour ahead of Redis's clock as it reads now
    await aredis.hset(KEYS.rate_bucket("k1"), mapping={"tokens": 0, "ts": now_ms() + HOUR_MS})
    refused = await limiter.take("k1", quota)
    assert not refused.allowed and refused.retry_after_s == 1
    await asyncio.sleep(0.02)  # a token every ms: twenty came since
    assert (await limiter.take("k1", quota)).allowed


async def test_a_bucket_above_a_lowered_burst_holds_the_burst(aredis: aioredis.Redis) -> None:
    limiter = RateLimiter(aredis, KEYS)
    quota = Quota(rate_per_s=0.001, burst=10, max_in_flight=1, max_streams=1)
    # filled at a burst of 200 by another replica in this very ms (or ahead of Redis's clock)
    await aredis.hset(KEYS.rate_bucket("k2"), mapping={"tokens": 150, "ts": now_ms() + HOUR_MS})
    taken = await limiter.take("k2", quota)
    assert taken.allowed and taken.remaining == quota.burst - 1 and taken.reset_s > 0
    assert await aredis.exists(KEYS.rate_bucket("k2"))
    assert (await limiter.take("k2", quota)).remaining == quota.burst - 2

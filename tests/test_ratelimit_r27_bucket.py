"""A key's token bucket on a real Valkey at the edges its bounds allow (a burst of up to 10^9, a
rate down to 1e-6 per second): Lua's `tostring` keeps 14 significant digits, so a bucket of
hundreds of millions of tokens stored its count to 1e-5 and every take dropped a smaller refill
(a slow rate, taken often), for ever. A stream's place and an in-flight slot stamped on Redis's
clock must lapse once their holder died even when that clock stepped back (a failover to a
replica behind it)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.job_store import now_ms
from shared.keys import Keys
from shared.rate_limit import InFlightLimiter, Quota, RateLimiter, StreamLimiter

KEYS = Keys("rl-r27:")
HOUR_MS = 3_600_000


async def test_a_large_bucket_keeps_a_slow_rates_refill(aredis: aioredis.Redis) -> None:
    limiter = RateLimiter(aredis, KEYS)
    quota = Quota(rate_per_s=1e-6, burst=1_000_000_000, max_in_flight=1, max_streams=1)
    bucket = KEYS.rate_bucket("k1")
    # last taken 4 s ago (a token every 11.6 days): 4e-6 of a token came since
    await aredis.hset(bucket, mapping={"tokens": 500_000_000, "ts": now_ms() - 4_000})
    assert (await limiter.take("k1", quota)).remaining == 499_999_999
    refilled = float(await aredis.hget(bucket, "tokens") or 0) - 499_999_999
    assert 3.9e-6 < refilled < 1e-4, refilled


async def test_a_dead_streams_place_lapses_after_redis_clock_stepped_back(
    aredis: aioredis.Redis,
) -> None:
    """A place last renewed an hour ahead of Redis's clock as it reads now (a failover to a
    replica whose clock is behind), by a producer that died since, lapsed only once the clock
    caught up: the key, at its cap, could open no stream for that hour."""
    limiter = StreamLimiter(aredis, KEYS, lapse_s=0.05)
    places = KEYS.open_streams("k2")
    await aredis.zadd(places, {"dead": now_ms() + HOUR_MS})
    assert not await limiter.hold("k2", "s1", cap=1)  # within its lapse from now
    await asyncio.sleep(0.1)  # unrenewed past its lapse
    assert await limiter.hold("k2", "s1", cap=1)
    assert await aredis.zrange(places, 0, -1) == [b"s1"]


async def test_a_dead_submits_slot_is_pruned_after_redis_clock_stepped_back(
    aredis: aioredis.Redis,
) -> None:
    """A submit that died in a failover left its slot admitted an hour ahead of the new
    primary's clock, with no job hash: it looked like a submit still writing until that clock
    caught up, and the key at its cap was refused for the hour."""
    limiter = InFlightLimiter(aredis, KEYS, ttl_s=60)
    await aredis.zadd(KEYS.in_flight("k3"), {"died": now_ms() + HOUR_MS})
    assert await limiter.admit("k3", "fresh", cap=1)
    assert await aredis.zrange(KEYS.in_flight("k3"), 0, -1) == [b"fresh"]

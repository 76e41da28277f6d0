"""Scripts whose reply was lost after the server ran them (a connection torn at the worst time,
through a real proxy to a real Valkey), so that the client sent them again:
- the prune of an API key's in-flight set at its cap freed the slots of jobs that ended, but its
  rerun found them gone and said it freed none: the submit was refused 429 with room to spare;
- a worker's count of a second's finished jobs per variant was added twice, requests, errors and
  latency samples alike: what a canary's step and an experiment's statistics are judged on;
- a shadow look's claim of its ended pairs found them claimed (by its own first run) and left
  them uncompared and uncounted until the claim was taken for abandoned, a minute later."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlparse

import redis.asyncio as aioredis

from shared import rate_limit, shadow_pairs, variant_stats
from shared.keys import Keys
from shared.rate_limit import InFlightLimiter
from shared.redis_client import RedisClient, connect
from shared.shadow_pairs import ShadowPair, ShadowPairs
from shared.variant_stats import Sample, VariantStats
from tests.reply_dropper import ReplyDropper


@asynccontextmanager
async def reply_lost(
    redis_url: str, aredis: aioredis.Redis, script: str
) -> AsyncIterator[RedisClient]:
    """A client whose first call of `script` (loaded first: the reply lost is its run's, not a
    NOSCRIPT) has its reply lost, and is sent again."""
    await aredis.script_load(script)
    url = urlparse(redis_url)
    marker = hashlib.sha1(script.encode()).hexdigest().encode()
    proxy = ReplyDropper(url.hostname or "127.0.0.1", url.port or 6379, marker)
    client = connect(await proxy.start(), cluster=False)
    try:
        yield client
        assert proxy.dropped == 1
    finally:
        await client.aclose()
        await proxy.stop()


def _keys() -> Keys:
    return Keys(f"r37-rerun-{uuid.uuid4().hex[:8]}:")


async def test_a_prune_whose_release_was_sent_again_admits_the_job(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    keys = _keys()
    await aredis.zadd(keys.in_flight("k1"), {"ended": 1})
    await aredis.hset(keys.job("ended"), "status", "succeeded")
    async with reply_lost(redis_url, aredis, rate_limit.RELEASE) as client:
        limiter = InFlightLimiter(client, keys, ttl_s=60)
        assert await limiter.admit("k1", "fresh", cap=1)  # "ended" pruned, its slot given
    assert await aredis.zrange(keys.in_flight("k1"), 0, -1) == [b"fresh"]


async def test_finished_jobs_whose_count_was_sent_again_are_counted_once(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    keys = _keys()
    samples = [Sample(True, 5.0, 20.0), Sample(False, 1.0, 2.0, bulk=True)]
    async with reply_lost(redis_url, aredis, variant_stats._RECORD) as client:
        await VariantStats(client, keys).record_samples({("m", "v1"): samples})
    window = (await VariantStats(aredis, keys).window("m", ["v1"], since_s=time.time() - 60))["v1"]
    assert (window.requests, window.errors) == (2, 1)
    assert sorted(s.encode() for s in window.samples) == sorted(s.encode() for s in samples)


async def test_a_shadow_claim_sent_again_is_still_the_looks_own(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    keys = _keys()
    ended, dropped = ShadowPair("p1", "s1", "v1", "v2"), ShadowPair("p2", "s2", "v1", "v2")
    for pair in (ended, dropped):
        await ShadowPairs(aredis, keys, ttl_s=60).add("m", pair)
    async with reply_lost(redis_url, aredis, shadow_pairs._TAKE) as client:
        taken = await ShadowPairs(client, keys, ttl_s=60).take("m", [ended], drop=[dropped])
    assert taken == ([True], [True])  # this look compares the one and counts the other dropped
    assert await aredis.zrange(keys.shadow_claims("m"), 0, -1) == [ended.member()]
    assert await aredis.zrange(keys.shadow_pairs("m"), 0, -1) == []

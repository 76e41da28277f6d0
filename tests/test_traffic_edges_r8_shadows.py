"""A primary copied to two shadow variants makes two pairs with one primary id: each is
compared and counted once, whichever look settles it (real Valkey)."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from producer_api.routes.shadowing import ShadowComparisons
from shared.codec import dumps
from shared.job_store import JobStore
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelConfig, ModelRepository, Variant
from shared.shadow_pairs import ShadowPair, ShadowPairs
from shared.variant_stats import VariantStats

KEYS = Keys("r8shadows:")
SHADOW = Variant(weight=0, shadow=True)
CONFIG = ModelConfig(
    name="m",
    kind="batch",
    backend="identity",
    default_variant="stable",
    variants={"stable": Variant(), "mirror": SHADOW, "echo": SHADOW},
)


async def _job(client: aioredis.Redis, job_id: str, variant: str, status: str) -> None:
    """A job's hash as a worker leaves it (one embedding of one number when it succeeded)."""
    fields = {"model": "m", "variant": variant, "status": status, "created": 1, "started": 2}
    if status == "succeeded":
        fields |= {"finished": 5, "outputs": dumps({"embeddings": [[1.0]]}).decode()}
    await client.hset(KEYS.job(job_id), mapping=fields)


async def test_the_second_shadow_of_one_primary_is_compared_in_a_later_look(
    aredis: aioredis.Redis,
) -> None:
    """Results were found by primary id alone: once one shadow's pair was compared, the other
    shadow's pair of the same request, ended a look later, read as compared before (its page
    long forgotten), and was released uncompared and uncounted: a second shadow variant lost
    every comparison whose copy finished after the first's."""
    await aredis.flushdb()
    store, stats = JobStore(aredis, KEYS, ttl_s=60), VariantStats(aredis, KEYS)
    pairs = ShadowPairs(aredis, KEYS, ttl_s=60)
    primary = new_job_id("m", "stable")
    mirror = ShadowPair(primary, new_job_id("m", "mirror"), "stable", "mirror")
    echo = ShadowPair(primary, new_job_id("m", "echo"), "stable", "echo")
    await _job(aredis, primary, "stable", "succeeded")
    await _job(aredis, mirror.shadow_id, "mirror", "succeeded")
    await _job(aredis, echo.shadow_id, "echo", "running")
    for pair in (mirror, echo):
        await pairs.add("m", pair)
    comparisons = ShadowComparisons(pairs, store, stats, ModelRepository({"m": CONFIG}), 60)

    await comparisons.look()
    assert [pair for pair, _ in await pairs.pending("m", 10)] == [echo]
    await _job(aredis, echo.shadow_id, "echo", "succeeded")
    await comparisons.look()

    assert await pairs.pending("m", 10) == []
    windows = await stats.window("m", ["mirror", "echo"], time.time() - 60)
    counted = {
        v: (w.counters["shadow_pairs"], w.counters["shadow_agreed"]) for v, w in windows.items()
    }
    assert counted == {"mirror": (1, 1), "echo": (1, 1)}

"""A shadow look with nothing to claim or drop writes nothing: it wrote a claim call's reply key
(`…:pending:claimed:call:<token>`, kept ~10 s) for every model on every look (twice a second),
whether or not the model had shadows or pairs, ~20 live keys per model and writes for nothing."""

from __future__ import annotations

import redis.asyncio as aioredis

from producer_api.routes.shadowing import ShadowComparisons
from shared.job_store import JobStore
from shared.model_repository import ModelRepository
from shared.shadow_pairs import ShadowPairs
from shared.variant_stats import VariantStats
from tests.test_shadow_copies import CONFIG, KEYS
from tests.test_shadow_r21_edges import _paired

TTL_S = 60


async def test_a_look_with_nothing_pending_writes_no_key(aredis: aioredis.Redis) -> None:
    """A model without pairs: looked at twice, Redis holds no key at all."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=TTL_S), ShadowPairs(aredis, KEYS, ttl_s=TTL_S)
    look = ShadowComparisons(
        pairs, store, VariantStats(aredis, KEYS), ModelRepository({"m": CONFIG}), 60
    )
    await look.look()
    await look.look()
    assert await aredis.keys("*") == []


async def test_a_look_at_pairs_still_running_claims_nothing(aredis: aioredis.Redis) -> None:
    """A pair whose jobs are still queued: the look leaves it pending and writes no claim key."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=TTL_S), ShadowPairs(aredis, KEYS, ttl_s=TTL_S)
    await _paired(store, pairs)
    before = set(await aredis.keys("*"))
    look = ShadowComparisons(
        pairs, store, VariantStats(aredis, KEYS), ModelRepository({"m": CONFIG}), 60
    )
    await look.look()
    assert set(await aredis.keys("*")) == before
    assert await aredis.zcard(KEYS.shadow_pairs("m")) == 1


async def test_take_of_nothing_answers_empty_flags(aredis: aioredis.Redis) -> None:
    """`take` with no pair to claim or drop answers no flags, and writes no reply key."""
    await aredis.flushdb()
    pairs = ShadowPairs(aredis, KEYS, ttl_s=TTL_S)
    assert await pairs.take("m", []) == ([], [])
    assert await aredis.keys("*") == []

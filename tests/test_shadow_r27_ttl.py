"""The pending set of a model's shadow pairs on a real Valkey, in process: it got a TTL from the
first look only, so a set whose pairs were copied and never looked at (no leader ever ran the
comparisons, or the model left the repository first) was kept for ever. It carries the looks'
bound from the copy that creates it."""

from __future__ import annotations

import redis.asyncio as aioredis

from producer_api.routes.shadowing import ShadowCopies
from shared.job_store import JobStore
from shared.shadow_pairs import ShadowPairs
from tests.test_shadow_copies import KEYS, _online, _shadowed

TTL_S = 60


async def test_a_pending_set_no_look_read_expires(aredis: aioredis.Redis) -> None:
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=TTL_S), ShadowPairs(aredis, KEYS, ttl_s=TTL_S)
    await _shadowed(ShadowCopies(store, pairs, KEYS), await _online(store, "copied, never read"))
    pending = KEYS.shadow_pairs("m")
    assert await aredis.zcard(pending) == 1
    assert 0 < await aredis.ttl(pending) <= TTL_S
    await aredis.flushdb()

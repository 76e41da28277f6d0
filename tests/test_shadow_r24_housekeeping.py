"""Shadow pair housekeeping on a real Valkey, in process: the pending and claimed sets of a
model's pairs carry a TTL the look renews, so those of a model taken out of the repository
(looked at no more) expire rather than stay for ever; a pair one of whose jobs ended without
running is dropped at once, and one failed by a worker without running adds no latency delta."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from producer_api.routes.shadowing import ShadowComparisons
from shared.codec import dumps
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.model_repository import ModelRepository
from shared.shadow_pairs import ShadowPair, ShadowPairs
from shared.variant_stats import VariantStats
from tests.test_shadow_copies import CONFIG, KEYS, _dropped
from tests.test_shadow_r21_edges import _paired, _ran

TTL_S = 60


async def test_a_removed_models_pairs_expire_after_its_last_look(aredis: aioredis.Redis) -> None:
    """A pair still waiting (its jobs queued) when its model leaves the repository: the last
    look that had the model leaves its pending set with a TTL; a claim a failed look left
    behind (claimed, never released) has one too. Without, both sets stayed for ever."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=TTL_S), ShadowPairs(aredis, KEYS, ttl_s=TTL_S)
    await _paired(store, pairs)
    primary, shadow = await _paired(store, pairs)
    repository = ModelRepository({"m": CONFIG})
    await ShadowComparisons(pairs, store, VariantStats(aredis, KEYS), repository, 60).look()
    pending, claimed = KEYS.shadow_pairs("m"), KEYS.shadow_claims("m")
    assert await aredis.zcard(pending) == 2  # both wait: nothing ended
    assert 0 < await aredis.ttl(pending) <= TTL_S

    claim = ShadowPair(primary.job_id, shadow.job_id, "stable", "mirror")
    assert (await pairs.take("m", [claim]))[0] == [True]  # its look fails before `done`
    assert await aredis.zcard(claimed) == 1
    assert 0 < await aredis.ttl(claimed) <= TTL_S
    assert await aredis.zrange(pending, 0, -1) != []  # `waiting`'s pair, under the look's TTL
    assert 0 < await aredis.ttl(pending) <= TTL_S


async def test_a_pair_with_a_job_ended_unrun_is_dropped_at_once(aredis: aioredis.Redis) -> None:
    """A primary cancelled while its copy is queued, and a copy expired in its lane while its
    primary runs: neither pair can be compared, and each was read again every look until the
    other job ended, only to be released. The first look drops both (`unran`)."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=TTL_S), ShadowPairs(aredis, KEYS, ttl_s=TTL_S)
    cancelled, _ = await _paired(store, pairs)
    await store.transition(cancelled.job_id, JobStatus.CANCELLED, {})
    running, expired = await _paired(store, pairs)
    await store.transition(running.job_id, JobStatus.RUNNING, {"started": now_ms()})
    await store.transition(expired.job_id, JobStatus.EXPIRED, {})
    unran = _dropped("unran")
    repository = ModelRepository({"m": CONFIG})
    await ShadowComparisons(pairs, store, VariantStats(aredis, KEYS), repository, 60).look()
    assert await aredis.zcard(KEYS.shadow_pairs("m")) == 0
    assert _dropped("unran") == unran + 2


async def test_a_pair_with_a_job_failed_unrun_has_no_latency_delta(
    aredis: aioredis.Redis,
) -> None:
    """A primary the worker failed at its read (its entry no job): it has the read as `started`
    and a `finished` a ms later, and read as run in 1 ms, its pair's delta as the copy's whole
    service time (here 400 ms). It adds its error delta, untimed."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=TTL_S), ShadowPairs(aredis, KEYS, ttl_s=TTL_S)
    stats = VariantStats(aredis, KEYS)
    primary, shadow = await _paired(store, pairs)
    read = now_ms()
    error = dumps({"type": "UndecodableEntry", "message": "no job"}).decode()
    unrun = {"error": error, "started": read, "finished": read + 1}
    await store.transition(primary.job_id, JobStatus.FAILED, unrun)
    await _ran(store, shadow, 400)
    await ShadowComparisons(pairs, store, stats, ModelRepository({"m": CONFIG}), 60).look()
    counters = (await stats.window("m", ["mirror"], time.time() - 60))["mirror"].counters
    assert counters["shadow_pairs"] == 1 and counters["shadow_failed_primary_only"] == 1
    assert counters["shadow_untimed_pairs"] == 1
    assert counters["shadow_latency_delta_ms"] == 0  # none added

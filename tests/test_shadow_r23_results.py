"""Shadows on a real Valkey, in process: a primary's unnamed comparison fields are the last
compared shadow's alone, a pair whose primary's record expired is dropped at the first look
rather than read again until MAX_PAIR_AGE_MS, and a request whose parameters a shadow variant
refuses is not copied to it."""

from __future__ import annotations

import redis.asyncio as aioredis

from producer_api.routes.shadowing import ShadowComparisons, ShadowCopies
from shared.codec import RequestEntry, dumps
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import new_job_id
from shared.model_repository import ModelConfig, ModelRepository, Variant
from shared.shadow_pairs import ShadowPair, ShadowPairs
from shared.variant_stats import VariantStats
from tests.test_shadow_copies import CONFIG, KEYS, MIRROR, ROUTES, _copies, _dropped
from tests.test_shadow_r21_edges import _job, _paired, _ran


def _comparisons(aredis: aioredis.Redis) -> tuple[JobStore, ShadowPairs, ShadowComparisons]:
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    stats, repository = VariantStats(aredis, KEYS), ModelRepository({"m": CONFIG})
    return store, pairs, ShadowComparisons(pairs, store, stats, repository, 60)


async def test_unnamed_fields_drop_a_delta_the_last_shadow_lacks(aredis: aioredis.Redis) -> None:
    """One request, two shadows: `mirror` compared first with a latency delta, then `flaky`,
    failed before it ran (no delta). HSET cannot drop a field, so the unnamed
    `latency_delta_ms` kept mirror's beside flaky's `shadow_variant`."""
    await aredis.flushdb()
    store, pairs, comparisons = _comparisons(aredis)
    primary, mirror = await _paired(store, pairs)
    flaky = await _job(store, "flaky")
    await pairs.add("m", ShadowPair(primary.job_id, flaky.job_id, "stable", "flaky"))
    await _ran(store, primary, 10)
    await _ran(store, mirror, 25)
    await comparisons.look()  # flaky's copy still queued: only mirror's pair compared
    assert (await pairs.result(primary.job_id))["latency_delta_ms"] == "15.000"

    error = {"error": dumps({"message": "undecodable entry"}).decode()}
    await store.transition(flaky.job_id, JobStatus.FAILED, error)
    await comparisons.look()

    result = await pairs.result(primary.job_id)
    assert result["shadow_variant"] == "flaky" and result["error_delta"] == "1"
    assert "latency_delta_ms" not in result and "latency_delta_ms:flaky" not in result
    assert result["latency_delta_ms:mirror"] == "15.000"  # each shadow's own is kept


async def test_a_pair_whose_primary_expired_is_dropped_at_once(aredis: aioredis.Redis) -> None:
    """The primary's record is written before its pair, so one gone is expired, never still to
    come: the pair waited as `vanished` until MAX_PAIR_AGE_MS, its two records read each look.
    A young pair whose copy's record is missing (it may be written yet) still waits."""
    await aredis.flushdb()
    store, pairs, comparisons = _comparisons(aredis)
    expired, _ = await _paired(store, pairs)
    await aredis.delete(KEYS.job(expired.job_id))  # its record gone, as at its TTL
    young = await _job(store, "stable")
    await pairs.add("m", ShadowPair(young.job_id, "m.mirror.not-yet-written", "stable", "mirror"))
    vanished = _dropped("vanished")

    await comparisons.look()

    assert _dropped("vanished") == vanished + 1
    [(waiting, _)] = await pairs.pending("m", 10)
    assert waiting.primary_id == young.job_id


async def test_a_request_the_shadow_would_refuse_is_not_copied(aredis: aioredis.Redis) -> None:
    """A generate model's variants may limit `max_tokens` apart: a request the primary took
    with max_tokens 32 was copied to a shadow limited to 8, whose submit refuses it (422), and
    its answer (cut by vLLM, or run past the limit by a custom engine) was compared. It is not
    copied (`refused`); one within the shadow's limit is."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    limited = Variant(weight=0, shadow=True, parameters={"max_tokens_limit": 8})
    config = ModelConfig(
        name="m",
        kind="generate",
        backend="tests.fault_engine:FaultEngine",
        default_variant="stable",
        variants={"stable": Variant(), "mirror": limited},
    )
    copies, refused = ShadowCopies(store, pairs, KEYS), _copies("refused")

    requests = [
        RequestEntry(
            new_job_id("m", "stable"),
            {"inputs": {"prompt": "x"}, "parameters": {"max_tokens": n}},
            now_ms(),
        )
        for n in (32, 8)
    ]
    for request in requests:
        copies.copy(config, ROUTES, request, "stable")
    await copies.stop()

    assert _copies("refused") == refused + 1
    [(pair, _)] = await pairs.pending("m", 10)
    assert pair.primary_id == requests[1].job_id and await aredis.xlen(MIRROR) == 1
    copy = await store.get(pair.shadow_id)
    assert copy is not None and copy.fields["variant"] == "mirror"

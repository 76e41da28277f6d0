"""Shadow comparison edges on a real Valkey, in process: a pair one of whose jobs failed before it
ran adds its error delta but no latency delta, and a shadow copy is never left running without
its pair when Redis fails between recording the two."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer_api.experiments.statistics import summary
from producer_api.routes.shadowing import ShadowComparisons, ShadowCopies
from shared.codec import RequestEntry, dumps
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import new_job_id
from shared.model_repository import ModelRepository
from shared.shadow_pairs import ShadowPair, ShadowPairs
from shared.variant_stats import VariantStats, Window
from tests.test_shadow_copies import CONFIG, KEYS, MIRROR, ROUTES, _copies, _dropped

OUTPUTS = {"embeddings": [[1.0, 0.0]]}


async def _job(store: JobStore, variant: str) -> RequestEntry:
    entry = RequestEntry(new_job_id("m", variant), {"inputs": {"text": "x"}}, now_ms())
    lane = KEYS.queue("m", variant) if variant == "stable" else MIRROR
    await store.create(entry, lane, {"model": "m", "variant": variant})
    return entry


async def _ran(store: JobStore, entry: RequestEntry, service_ms: int) -> None:
    """The job ran for `service_ms` (its stamps set, not waited for) and answered OUTPUTS."""
    finished = now_ms()
    await store.transition(entry.job_id, JobStatus.RUNNING, {"started": finished - service_ms})
    ended: dict[str, Any] = {"outputs": dumps(OUTPUTS).decode(), "finished": finished}
    await store.transition(entry.job_id, JobStatus.SUCCEEDED, ended)


async def _paired(store: JobStore, pairs: ShadowPairs) -> tuple[RequestEntry, RequestEntry]:
    primary, shadow = await _job(store, "stable"), await _job(store, "mirror")
    await pairs.add("m", ShadowPair(primary.job_id, shadow.job_id, "stable", "mirror"))
    return primary, shadow


async def test_a_job_failed_before_it_ran_adds_no_latency_delta(aredis: aioredis.Redis) -> None:
    """A job failed while queued (undecodable, dead-lettered before a run) has no `started`
    stamp: it read as a service time of 0, so its pair's latency delta was the other job's
    whole service time (here 400 ms), summed into the shadow's mean. It adds its error delta
    and is counted untimed; the timed pair beside it alone makes the delta sum."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    stats = VariantStats(aredis, KEYS)
    untimed_primary, untimed_shadow = await _paired(store, pairs)
    error = {"error": dumps({"message": "undecodable entry"}).decode()}
    await store.transition(untimed_primary.job_id, JobStatus.FAILED, error)
    await _ran(store, untimed_shadow, 400)
    timed_primary, timed_shadow = await _paired(store, pairs)
    await _ran(store, timed_primary, 10)
    await _ran(store, timed_shadow, 25)

    await ShadowComparisons(pairs, store, stats, ModelRepository({"m": CONFIG}), 60).look()

    counters = (await stats.window("m", ["mirror"], time.time() - 60))["mirror"].counters
    assert counters["shadow_latency_delta_ms"] == pytest.approx(15.0, abs=0.01)
    assert counters["shadow_pairs"] == 2 and counters["shadow_untimed_pairs"] == 1
    assert counters["shadow_failed_primary_only"] == 1
    untimed = await pairs.result(untimed_primary.job_id)
    assert untimed["error_delta:mirror"] == "-1" and "latency_delta_ms:mirror" not in untimed
    assert (await pairs.result(timed_primary.job_id))["latency_delta_ms:mirror"] == "15.000"


async def test_a_copy_whose_pair_cannot_be_recorded_is_not_enqueued(
    aredis: aioredis.Redis,
) -> None:
    """The copy was enqueued before its pair was recorded: a Redis error between the two (here
    the pairs' key of the wrong type) left a copy that ran, never compared, and was counted
    dropped. The pair is recorded first now: the copy is not written, as counted."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    await aredis.set(KEYS.shadow_pairs("m"), "not a sorted set")
    copies, dropped = ShadowCopies(store, pairs, KEYS), _copies("dropped")

    copies.copy(CONFIG, ROUTES, await _job(store, "stable"), "stable")
    await copies.stop()

    assert _copies("dropped") == dropped + 1
    assert await aredis.xlen(MIRROR) == 0
    assert await aredis.keys(f"{KEYS.prefix}job:*mirror*") == []


async def test_a_pair_recorded_before_its_copy_waits_for_it(aredis: aioredis.Redis) -> None:
    """The pair is recorded before its copy is written: a look between the two finds no copy,
    and dropped the pair as `vanished` when it was only young. It waits (a pair whose copy
    never came is dropped once past MAX_PAIR_AGE_MS), and is compared once both ended."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    stats, vanished = VariantStats(aredis, KEYS), _dropped("vanished")
    comparisons = ShadowComparisons(pairs, store, stats, ModelRepository({"m": CONFIG}), 60)
    primary = await _job(store, "stable")
    shadow = RequestEntry(new_job_id("m", "mirror"), {"inputs": {"text": "x"}}, now_ms())
    await pairs.add("m", ShadowPair(primary.job_id, shadow.job_id, "stable", "mirror"))

    await comparisons.look()
    assert len(await pairs.pending("m", 10)) == 1 and _dropped("vanished") == vanished

    await store.create(shadow, MIRROR, {"model": "m", "variant": "mirror"})
    await _ran(store, primary, 10)
    await _ran(store, shadow, 10)
    await comparisons.look()
    assert await pairs.pending("m", 10) == []
    assert (await pairs.result(primary.job_id))["agree:mirror"] == "1"


def test_the_mean_latency_delta_is_over_the_timed_pairs_alone() -> None:
    """An untimed pair adds no delta; counted in the divisor it pulled the mean toward 0."""
    window = Window()
    window.counters |= {"shadow_pairs": 2, "shadow_untimed_pairs": 1}
    window.counters |= {"shadow_latency_delta_ms": 15.0, "shadow_agree": 2}
    shadow = summary(window)["shadow"]
    assert shadow is not None and shadow["mean_latency_delta_ms"] == 15.0
    window.counters |= {"shadow_untimed_pairs": 2, "shadow_latency_delta_ms": 0.0}
    assert summary(window)["shadow"]["mean_latency_delta_ms"] is None

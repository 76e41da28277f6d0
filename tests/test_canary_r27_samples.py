"""A step's p99 is judged on its online jobs' latency samples, which a bucket keeps up to
SAMPLES_PER_BUCKET: Batch API items (the bulk lane) filled that cap as well, so heavy batch
traffic left no room for the online samples, and a slow canary was never judged (nor rolled
back) however many online jobs it served. Online samples come first now; on a real Valkey."""

from __future__ import annotations

import time
from dataclasses import replace

import redis.asyncio as aioredis

from producer_api.canary.controller import CanaryController
from shared.canary_store import CanaryStore
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.stats_window import BUCKET_S, SAMPLES_PER_BUCKET, bucket_of
from shared.variant_stats import Sample, VariantStats
from shared.webhook_events import WebhookDispatcher
from tests.test_canary_r22_p99_samples import CANARY

KEYS = Keys("canary-r27-samples:")
BULK = Sample(True, 60_000.0, 10.0, bulk=True)  # waited a minute behind online work, by design
SLOW = Sample(True, 1.0, 1_000.0)  # online, above the canary's max_p99_ms of 750


async def _online(stats: VariantStats, variant: str) -> list[Sample]:
    window = (await stats.window("ab", [variant], time.time() - BUCKET_S))[variant]
    return [s for s in window.samples if not s.bulk]


async def test_bulk_samples_leave_room_for_online_ones(aredis: aioredis.Redis) -> None:
    """A bucket full of bulk samples still takes online ones, in one call or in a later one
    (another worker's), and the bulk ones fill what room is left."""
    stats = VariantStats(aredis, KEYS)
    await stats.record_samples({("ab", "mixed"): [*[BULK] * SAMPLES_PER_BUCKET, SLOW, SLOW]})
    assert len(await _online(stats, "mixed")) == 2
    await stats.record_samples({("ab", "stable"): [BULK] * SAMPLES_PER_BUCKET})
    await stats.record_samples({("ab", "stable"): [SLOW] * 3})
    window = (await stats.window("ab", ["stable"], time.time() - BUCKET_S))["stable"]
    assert len(window.samples) == SAMPLES_PER_BUCKET  # the cap holds, whatever the kind
    assert len(await _online(stats, "stable")) == 3
    assert window.requests == SAMPLES_PER_BUCKET + 3  # every job counts, kept or not


async def test_a_slow_canary_under_heavy_batch_traffic_rolls_back(aredis: aioredis.Redis) -> None:
    """5 000 Batch API items and 40 slow online jobs in one worker's second: the online ones
    were dropped, the step's p99 never judged, and the canary stayed at 50 %."""
    stats = VariantStats(aredis, KEYS)
    await RouteStore(aredis, KEYS).seed("ab", Routes({"stable": 50.0, "candidate": 50.0}))
    began = (bucket_of(time.time()) - 1) * BUCKET_S  # the samples below fall in the step's window
    canary = replace(CANARY, step=0, weight=50.0, step_started_at=began)
    store = CanaryStore(aredis, KEYS)
    assert await store.start(canary)
    controller = CanaryController(
        store, RouteStore(aredis, KEYS), stats, ModelRepository({}), WebhookDispatcher("redis://")
    )
    batch = [*[BULK] * SAMPLES_PER_BUCKET, *[SLOW] * CANARY.min_requests]
    await stats.record_samples({("ab", "candidate"): batch})

    await controller.decide(canary)
    assert (canary.state, canary.weight) == ("rolled_back", 0.0)
    reason = (await store.events("ab", 1))[-1]["reason"]
    assert reason == "p99 1001.0 ms is above 750 ms", reason

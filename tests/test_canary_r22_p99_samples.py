"""Stack-free: a canary's p99 is judged on `min_requests` online jobs, never on a handful (a
step's Batch API items count as requests but have no p99 of their own), on a real Valkey."""

from __future__ import annotations

import time
from dataclasses import replace

import redis.asyncio as aioredis

from producer_api.canary.controller import CanaryController
from shared.canary_store import Canary, CanaryStore
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.stats_window import BUCKET_S, bucket_of
from shared.variant_stats import Sample, VariantStats
from shared.webhook_events import WebhookDispatcher

CANARY = Canary(
    model="ab",
    variant="candidate",
    baseline="stable",
    steps=[50, 100],
    interval_s=3600.0,  # no step comes due: only a breach decides
    max_error_rate=0.05,
    max_p99_ms=750,
    min_requests=40,
)


async def test_a_p99_of_a_few_online_jobs_rolls_nothing_back(aredis: aioredis.Redis) -> None:
    """39 Batch API items and one slow online job made the step's p99 that one job's 1 s: 40
    requests, `min_requests` seen, and a healthy canary rolled back on a p99 of one sample.
    Once 40 online jobs are that slow, it rolls back."""
    keys = Keys("canary-r22-p99:")
    stats = VariantStats(aredis, keys)
    await RouteStore(aredis, keys).seed("ab", Routes({"stable": 50.0, "candidate": 50.0}))
    began = (bucket_of(time.time()) - 1) * BUCKET_S  # the samples below fall in the step's window
    canary = replace(CANARY, step=0, weight=50.0, step_started_at=began)
    store = CanaryStore(aredis, keys)
    assert await store.start(canary)
    controller = CanaryController(
        store, RouteStore(aredis, keys), stats, ModelRepository({}), WebhookDispatcher("redis://")
    )
    slow = Sample(True, 1.0, 1_000.0)
    bulk = [Sample(True, 1.0, 10.0, bulk=True)] * 39
    healthy = [Sample(True, 1.0, 10.0)] * 40
    await stats.record_samples({("ab", "stable"): healthy, ("ab", "candidate"): [*bulk, slow]})

    await controller.decide(canary)
    assert (canary.state, canary.weight) == ("running", 50.0)
    assert await store.events("ab") == []

    await stats.record_samples({("ab", "candidate"): [slow] * 39})
    await controller.decide(canary)
    assert (canary.state, canary.weight) == ("rolled_back", 0.0)
    reason = (await store.events("ab", 1))[-1]["reason"]
    assert reason == "p99 1001.0 ms is above 750 ms", reason

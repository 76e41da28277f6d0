"""A canary's webhook events are the canary's, not a job's: handed to delivery naming the canary
(kind `canary`, its model), whose attempts no hash records (README, Webhooks: attempts are on
record for a batch, and a job's on its hash; a canary's record keeps its decisions, and the
worker's log its deliveries). They were handed over as a job `canary-<model>` that never
exists, each attempt written to a job hash that is never there. On a real Valkey, the event
read from the real Celery broker queue there."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer_api.canary.controller import CanaryController
from shared.canary_store import Canary, CanaryStore
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.variant_stats import VariantStats
from shared.webhook_events import WebhookDispatcher
from workers import webhook_delivery

KEYS = Keys("canary-hooks:")
MODEL = "ab"
HOOK = "https://hooks.example.com/canaries"


def _canary() -> Canary:
    return Canary(
        model=MODEL,
        variant="candidate",
        baseline="stable",
        steps=[10.0, 100.0],
        interval_s=3600.0,
        max_error_rate=0.05,
        max_p99_ms=1_000.0,
        min_requests=10,
        webhook=HOOK,
    )


async def _deliveries(client: aioredis.Redis) -> list[dict[str, Any]]:
    """The task kwargs of the deliveries in the broker's queue (kombu's messages)."""
    messages = await client.lrange("celery", 0, -1)
    return [json.loads(base64.b64decode(json.loads(m)["body"]))[1] for m in messages]


async def test_a_canary_event_is_handed_over_as_the_canarys(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    stats = VariantStats(aredis, KEYS)
    controller = CanaryController(
        store, routes, stats, ModelRepository({}), WebhookDispatcher(redis_url)
    )
    assert await controller.start(_canary())
    (delivery,) = await _deliveries(aredis)
    assert delivery["event"]["type"] == "model.canary.started"
    assert (delivery["kind"], delivery["target_id"]) == ("canary", MODEL)


class _NoAttemptLog:
    """Where a canary's attempt would be recorded: nowhere may ask for it."""

    def record(self, key: str, attempt: dict[str, Any], status: str) -> bool:
        raise AssertionError(f"a canary's attempt recorded on {key}")


def test_a_canary_delivery_records_its_attempt_on_no_hash(
    monkeypatch: pytest.MonkeyPatch, settings_env: Callable[..., None]
) -> None:
    settings_env(CONVEYOR_WEBHOOK_SECRET="")  # refused at once: one attempt, no POST
    monkeypatch.setattr(webhook_delivery, "_attempt_log", _NoAttemptLog)
    event = {"id": "evt_c1", "type": "model.canary.started", "tenant": "~operator"}
    status = webhook_delivery.deliver_webhook.run("canary", MODEL, HOOK, event, time.time())
    assert status == "failed"

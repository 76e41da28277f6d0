"""A canary decision's `model.canary.*` webhook is owed from the step that saves the decision
until the broker has it: a producer that died (or whose broker refused it) between the two lost
it for good, canary webhooks having no outbox. Whichever producer leads next hands it over, as
the same event (its id), on a real Valkey, read from the real Celery broker queue there."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import redis.asyncio as aioredis

from producer_api.canary.controller import CanaryController, owed_webhook
from shared.canary_store import CanaryStore, stamp
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.variant_stats import VariantStats
from shared.webhook_events import WebhookDispatcher
from tests.test_webhook_owed_edges_canary import MODEL, _canary

KEYS = Keys("canary-owed:")
NO_BROKER = "redis://127.0.0.1:1"  # nothing listens there: every hand-over is refused


async def _producer(client: aioredis.Redis, broker_url: str) -> CanaryController:
    routes = RouteStore(client, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    return CanaryController(
        CanaryStore(client, KEYS),
        routes,
        VariantStats(client, KEYS),
        ModelRepository({}),
        WebhookDispatcher(broker_url),
    )


async def _deliveries(client: aioredis.Redis) -> list[dict[str, Any]]:
    """The events of the deliveries in the broker's queue (kombu's messages), oldest first
    (kombu pushes on the left)."""
    messages = (await client.lrange("celery", 0, -1))[::-1]
    return [json.loads(base64.b64decode(json.loads(m)["body"]))[1]["event"] for m in messages]


async def test_an_end_saved_by_a_producer_that_died_is_handed_over_by_the_next_leader(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    store = CanaryStore(aredis, KEYS)
    assert await store.start(_canary())
    ended = replace(_canary(), state="rolled_back", step=0, weight=0.0)
    record = {"at": stamp(), "type": "rolled_back", "model": MODEL, "state": "rolled_back"}
    owed = owed_webhook(ended, "rolled_back", record)
    await store.save(ended, None, record, owed)  # and the producer dies: no hand-over
    assert await store.active() == [MODEL]  # still to be looked at: it owes its webhook

    leader = await _producer(aredis, redis_url)
    await leader.look()
    assert owed is not None
    assert await _deliveries(aredis) == [owed.body]  # the same event, its id with it
    assert await store.active() == []  # nothing owed any more: the ended canary is let go
    await leader.look()
    assert len(await _deliveries(aredis)) == 1


async def test_a_start_the_broker_refused_is_handed_over_by_the_next_look(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    starter = await _producer(aredis, NO_BROKER)
    assert await starter.start(_canary())  # the start stands, its webhook not handed over
    assert await _deliveries(aredis) == []

    leader = await _producer(aredis, redis_url)
    await leader.look()
    types = [e["type"] for e in await _deliveries(aredis)]
    assert types == ["model.canary.started", "model.canary.step"]  # in the order decided
    (canary,) = await starter.store.events(MODEL, limit=1)
    assert canary["type"] == "step"
    _, owed = await leader.store.owing(MODEL)
    assert owed == []

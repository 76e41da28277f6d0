"""An abort that lands while the traffic leader is deciding the same canary, on a real Valkey
without a stack. The leader read the canary running and is about to move it a step; the abort
(any producer) ends it at 0 %. Unserialized, the leader's step then wrote `running` and its
weight over the abort, which had already answered 200 `aborted`: the rollout went on. With the
per-model lock the abort waits for the decision and then ends the canary for good. The stack's
side of aborts (HTTP, CLI, gauges) is `tests/test_canary.py`."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from producer_api.canary.controller import CanaryController
from shared.canary_store import Canary, CanaryStore
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.variant_stats import VariantStats
from shared.webhook_events import WebhookDispatcher

KEYS = Keys("canary-race:")
MODEL = "ab"


class _HeldDecision(CanaryController):
    """The leader, holding each decision open until the gate opens (a slow stats read)."""

    def __init__(self, client: aioredis.Redis, gate: asyncio.Event) -> None:
        super().__init__(
            CanaryStore(client, KEYS),
            RouteStore(client, KEYS),
            VariantStats(client, KEYS),
            ModelRepository({}),
            WebhookDispatcher("redis://unused"),  # the canary has no webhook: never sent
        )
        self.gate = gate
        self.deciding = asyncio.Event()

    async def decide(self, canary: Canary) -> None:
        self.deciding.set()
        await self.gate.wait()
        await super().decide(canary)


def _canary() -> Canary:
    return Canary(
        model=MODEL,
        variant="candidate",
        baseline="stable",
        steps=[10.0, 50.0, 100.0],
        interval_s=60.0,
        max_error_rate=0.05,
        max_p99_ms=1_000.0,
        min_requests=10,
    )


async def test_an_abort_during_a_decision_is_not_undone_by_it(aredis: aioredis.Redis) -> None:
    gate = asyncio.Event()
    leader = _HeldDecision(aredis, gate)
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    assert await store.start(_canary())

    looking = asyncio.create_task(leader.look())  # its first decision: step 0, 10 %
    await asyncio.wait_for(leader.deciding.wait(), timeout=10)
    other_producer = _HeldDecision(aredis, asyncio.Event())
    aborting = asyncio.create_task(other_producer.abort(MODEL, "aborted by the test"))
    await asyncio.sleep(0.3)  # the abort has had time to act, were it not waiting
    gate.set()
    await looking

    assert await aborting is True
    canary = await store.get(MODEL)
    assert canary is not None and (canary.state, canary.weight) == ("aborted", 0.0), canary
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights["candidate"] == 0.0 and live.weights["stable"] == 100.0, live
    assert await store.active() == []
    kinds = [event["type"] for event in await store.events(MODEL, 10)]
    assert kinds == ["step", "aborted"], kinds  # the step happened, then the abort ended it
    assert await other_producer.abort(MODEL, "again") is False


async def test_the_leader_passes_over_a_canary_an_abort_holds(aredis: aioredis.Redis) -> None:
    """While an abort holds the lock, the leader's look leaves the canary alone (no step)."""
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    assert await store.start(_canary())
    leader = _HeldDecision(aredis, asyncio.Event())
    leader.gate.set()
    async with store.lock(MODEL, wait_s=1.0):
        await leader.look()
        held = await store.get(MODEL)
        assert held is not None and (held.step, held.weight) == (-1, 0.0), held
    await leader.look()
    moved = await store.get(MODEL)
    assert moved is not None and (moved.step, moved.weight) == (0, 10.0), moved

"""On a real Valkey without a stack: a canary's rollback puts the routes back as they were
before it started, to the bit, not merely in their ratios."""

from __future__ import annotations

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
from tests.conftest import REPO_ROOT

KEYS = Keys("canary-r11:")
TRAFFIC = ModelRepository.load(REPO_ROOT / "tests" / "fixtures" / "traffic_repository")
MODEL = "ab"


def _leader(client: aioredis.Redis) -> CanaryController:
    return CanaryController(
        CanaryStore(client, KEYS),
        RouteStore(client, KEYS),
        VariantStats(client, KEYS),
        TRAFFIC,
        WebhookDispatcher("redis://unused"),  # the canary has no webhook: never sent
    )


async def _stepped(client: aioredis.Redis, before: dict[str, float], steps: list[float]) -> None:
    """Seed `before`, start a canary of candidate and take each of `steps` in turn."""
    await RouteStore(client, KEYS).seed(MODEL, Routes(before))
    canary = Canary(MODEL, "candidate", "stable", steps, 60.0, 0.05, 1_000.0, 10)
    assert await CanaryStore(client, KEYS).start(canary)
    leader = _leader(client)
    await leader.look()  # the first step
    for step in range(1, len(steps)):
        running = await CanaryStore(client, KEYS).get(MODEL)
        assert running is not None
        await leader.move(running, step, "step", "bounds held", {})


@pytest.mark.parametrize(
    ("before", "steps"),
    [
        ({"stable": 60.0, "flaky": 40.0, "candidate": 0.0}, [3.0]),
        ({"stable": 97.0, "flaky": 3.0, "candidate": 0.0}, [1.0, 10.0, 33.0]),
        ({"stable": 97.0, "flaky": 3.0, "candidate": 0.0}, [1.0, 10.0, 33.0, 100.0]),
        ({"stable": 85.0, "flaky": 15.0, "candidate": 0.0}, [1.0, 10.0]),
    ],
)
async def test_a_rollback_restores_the_weights_before_the_canary_exactly(
    aredis: aioredis.Redis, before: dict[str, float], steps: list[float]
) -> None:
    """Each step scaled the other variants from the last, and the rollback scaled them back:
    60/40 came back as 60/39.99999999999999, routes no operator had set."""
    await _stepped(aredis, before, steps)
    assert await _leader(aredis).abort(MODEL, "aborted by the test")
    live = (await RouteStore(aredis, KEYS).get_many([MODEL]))[MODEL]
    assert live.weights == before, live


async def test_a_rollback_keeps_ratios_an_operator_set_during_the_canary(
    aredis: aioredis.Redis,
) -> None:
    """Others' weights changed by hand mid-canary (the variant's own untouched) are the ones
    handed back, in their new ratios, not the weights before the canary."""
    await _stepped(aredis, {"stable": 60.0, "flaky": 40.0, "candidate": 0.0}, [20.0])
    routes = RouteStore(aredis, KEYS)
    live = (await routes.get_many([MODEL]))[MODEL]
    changed = Routes({"stable": 40.0, "flaky": 40.0, "candidate": 20.0})
    await routes.put(MODEL, changed, "test", live.version)
    assert await _leader(aredis).abort(MODEL, "aborted by the test")
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights == {"stable": 50.0, "flaky": 50.0, "candidate": 0.0}, live

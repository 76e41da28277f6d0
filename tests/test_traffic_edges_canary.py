"""Canary edges on a real Valkey, the controller in-process (no stack, no worker)."""

from __future__ import annotations

import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from producer_api.canary.controller import CanaryController
from shared.canary_store import Canary, CanaryStore
from shared.keys import Keys
from shared.model_repository import ModelRepository, Variant
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.variant_stats import VariantStats
from shared.webhook_events import WebhookDispatcher
from tests.conftest import REPO_ROOT

KEYS = Keys("traffic-edges-canary:")
AB = ModelRepository.load(REPO_ROOT / "tests" / "fixtures" / "traffic_repository").models["ab"]


def _repository(**variants: Variant) -> ModelRepository:
    return ModelRepository({"ab": AB.model_copy(update={"variants": variants})})


def _controller(client: aioredis.Redis, repository: ModelRepository) -> CanaryController:
    return CanaryController(
        CanaryStore(client, KEYS),
        RouteStore(client, KEYS),
        VariantStats(client, KEYS),
        repository,
        WebhookDispatcher("redis://unused"),  # the canary has no webhook: never sent
    )


async def test_a_rollback_from_100_percent_gives_nothing_to_a_variant_since_removed(
    aredis: aioredis.Redis,
) -> None:
    """At 100 %, a redeploy made `candidate` config.yaml's choice and removed `flaky`, which had
    had 30 %. The rollback handed `flaky` its share back: routes no producer can serve, so they
    served config.yaml's, every request still on `candidate`, the canary `aborted` at 0 %."""
    routes = RouteStore(aredis, KEYS)
    variants = AB.variants
    await routes.seed("ab", Routes({"stable": 70.0, "flaky": 30.0, "candidate": 0.0}))
    canary = Canary("ab", "candidate", "stable", [100.0], 60.0, 0.01, 500.0, 200)
    assert await CanaryStore(aredis, KEYS).start(canary)
    await _controller(aredis, _repository(**variants)).look()  # the step to 100 %
    redeployed = _repository(
        stable=variants["stable"].model_copy(update={"weight": 0}),
        candidate=variants["candidate"].model_copy(update={"weight": 100}),
    )
    assert await _controller(aredis, redeployed).abort("ab", "aborted by the test")
    served, adjusted = await routes.served(redeployed.models["ab"])
    assert (served.weights, adjusted) == ({"stable": 100.0, "candidate": 0.0}, None)


async def test_a_redeploy_that_voids_the_canarys_routes_aborts_it_not_a_lost_rollback(
    aredis: aioredis.Redis,
) -> None:
    """A redeploy removed `flaky` while the canary's step gave it weight: producers served
    config.yaml's split (no `candidate`), which the leader took for the canary's own rollback
    whose record was lost (the last routes write was its own), and announced `rolled_back`
    with that reason and wrote config.yaml's split as the canary's."""
    routes, store = RouteStore(aredis, KEYS), CanaryStore(aredis, KEYS)
    await routes.seed("ab", Routes({"stable": 60.0, "flaky": 40.0, "candidate": 0.0}))
    canary = Canary("ab", "candidate", "stable", [5.0, 100.0], 3600.0, 0.01, 500.0, 200)
    assert await store.start(canary)
    await _controller(aredis, _repository(**AB.variants)).look()  # the step to 5 %
    stepped = await routes.history("ab", 1)
    without_flaky = {name: v for name, v in AB.variants.items() if name != "flaky"}
    await _controller(aredis, _repository(**without_flaky)).look()
    ended = await store.get("ab")
    assert ended is not None and ended.state == "aborted", ended
    assert (await store.events("ab", 1))[-1]["type"] == "aborted"
    assert await routes.history("ab", 1) == stepped  # left as they are


async def test_a_canary_redis_lost_leaves_no_running_gauge(aredis: aioredis.Redis) -> None:
    """Redis restarted without its data under a running canary: the leader, which had shown it
    running, found no canary and kept exporting `running` 1 and its weight until it stepped
    down."""
    routes, store = RouteStore(aredis, KEYS), CanaryStore(aredis, KEYS)
    await routes.seed("wiped", Routes({"stable": 100.0, "candidate": 0.0}))
    canary = Canary("wiped", "candidate", "stable", [5.0, 100.0], 3600.0, 0.01, 500.0, 200)
    assert await store.start(canary)
    leader = _controller(aredis, ModelRepository({}))
    await leader.look()
    labels = {"model": "wiped", "variant": "candidate"}
    assert REGISTRY.get_sample_value("conveyor_canary_weight", labels) == 5.0
    await aredis.delete(*await aredis.keys(f"{KEYS.prefix}*"))
    await leader.look()
    assert REGISTRY.get_sample_value("conveyor_canary_weight", labels) is None
    running = REGISTRY.get_sample_value("conveyor_canary_state", {**labels, "state": "running"})
    assert running is None

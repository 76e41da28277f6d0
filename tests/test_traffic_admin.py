"""The admin API for live traffic, through two in-process producers on one real Valkey: a refused
variant name is quoted cut short, a variant config.yaml marks `shadow: true` takes no live
traffic from routes or a canary alike, DELETE puts config.yaml's routes back, seen by every
producer as a PUT is, and traffic sent to a variant no worker serves is warned of."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.model_repository import QUOTED_CHARS, ModelRepository
from shared.routing import seed_routes
from shared.settings import Settings
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.conftest import REPO_ROOT, until_async

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"
AB = ModelRepository.load(TRAFFIC).models["ab"]
ROUTES = "/v1/models/ab/routes"
CANARY = "/v1/models/ab/canary"
LONG = "v" * 5_000
PREFIX = "traffic-admin:"


@pytest.fixture
async def producers(redis_url: str) -> AsyncIterator[list[httpx.AsyncClient]]:
    """Two producers sharing their keys (replicas), none another test's."""
    clients: list[httpx.AsyncClient] = []
    apps = [
        create_app(
            Settings(
                redis_url=redis_url,
                model_repository=TRAFFIC,
                auth="disabled",
                instance_id=f"traffic-admin-{n}",
                key_prefix=PREFIX,
            )
        )
        for n in range(2)
    ]
    async with apps[0].router.lifespan_context(apps[0]), apps[1].router.lifespan_context(apps[1]):
        for app in apps:
            transport = httpx.ASGITransport(app=app)
            clients.append(httpx.AsyncClient(transport=transport, base_url="http://localhost"))
        yield clients
        await clients[0].put(ROUTES, json=seed_routes(AB).document())
        for client in clients:
            await client.aclose()


async def _refused(response: httpx.Response, type_: str) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == type_, error
    message: str = error["message"]
    return message


async def test_an_unknown_variant_is_quoted_cut_short(
    producers: list[httpx.AsyncClient],
) -> None:
    """A 5 000-character variant name came back whole in the 422, as a refused prompt did."""
    api = producers[0]
    cut = f'"{LONG[: QUOTED_CHARS - 1]}… ({len(LONG) + 2} characters of JSON)'
    for response, field in (
        (await api.put(ROUTES, json={"weights": {"stable": 50, LONG: 50}}), ""),
        (await api.put(ROUTES, json={"weights": {"stable": 100}, "shadows": {LONG: 1.0}}), ""),
        (await api.post(CANARY, json={"variant": "candidate", "baseline": LONG}), "baseline: "),
    ):
        message = await _refused(response, "unknown_variant")
        assert message == f"{field}model ab has no variant {cut}", message


async def test_a_config_shadow_takes_no_live_traffic_from_routes_or_a_canary(
    producers: list[httpx.AsyncClient],
) -> None:
    """Routes gave `mirror` (`shadow: true`) 10 % of live traffic, which a canary refused."""
    api = producers[0]
    before = (await api.get(ROUTES)).json()
    routed = await api.put(ROUTES, json={"weights": {"stable": 90, "mirror": 10}})
    canary = await api.post(CANARY, json={"variant": "mirror"})
    said = (
        "variant mirror of model ab is a shadow (`shadow: true` in config.yaml): it takes"
        " copies of requests, never live traffic"
    )
    assert await _refused(routed, "invalid_routes") == said
    assert await _refused(canary, "invalid_request") == f"variant: {said}"  # the field refused
    assert (await api.get(ROUTES)).json() == before
    assert (await api.get(CANARY)).json()["canary"] is None
    # named with no weight, or as a shadow of the routes, it is still welcome
    kept = {"weights": {"stable": 100, "mirror": 0}, "shadows": {"mirror": 0.5}}
    assert (await api.put(ROUTES, json=kept)).status_code == 200


async def test_delete_puts_config_yaml_routes_back_on_every_producer(
    producers: list[httpx.AsyncClient],
) -> None:
    """There was no DELETE: going back to the deployed routes meant retyping them."""
    first, second = producers
    moved = await first.put(ROUTES, json={"weights": {"stable": 0, "candidate": 100}})
    assert moved.status_code == 200, moved.text
    version = moved.json()["version"]
    await until_async(lambda: _served_by(second, "candidate"))

    stale = await first.delete(ROUTES, params={"expected_version": version - 1})
    assert stale.status_code == 409, stale.text
    assert (await first.get(ROUTES)).json()["version"] == version
    reset = await first.delete(ROUTES, params={"expected_version": version})
    assert reset.status_code == 200, reset.text

    seeded = seed_routes(AB)
    view = reset.json()
    assert view["version"] == version + 1
    assert (view["weights"], view["shadows"], view["sticky_by"]) == (
        seeded.weights,
        seeded.shadows,
        seeded.sticky_by,
    )
    assert view["history"][-1]["new"] == seeded.document()
    assert await _served_by(first, "stable")  # at once on the producer that took it
    await until_async(lambda: _served_by(second, "stable"))


async def test_traffic_to_a_variant_no_worker_serves_is_warned(
    aredis: aioredis.Redis, producers: list[httpx.AsyncClient]
) -> None:
    """Routes and a canary fed a variant without a worker in silence: its share of users waited
    in a queue nobody read (a canary's step rolled back only after `max_step_s`)."""
    api = producers[0]
    workers = WorkerRegistry(aredis, Keys(PREFIX))
    await workers.publish(Heartbeat("w-stable", "host", 1, "serving", models=["ab:stable"]))
    split = {"weights": {"stable": 90, "candidate": 10}, "shadows": {"mirror": 0.5}}
    routes = (await api.put(ROUTES, json=split)).json()
    assert [w.split(" now")[0] for w in routes["warnings"]] == [
        "no worker serves ab:candidate",
        "no worker serves ab:mirror",
    ]
    await api.delete(ROUTES)
    canary = (await api.post(CANARY, json={"variant": "candidate"})).json()
    assert "no worker serves ab:candidate now" in canary["warnings"][0], canary
    await workers.publish(Heartbeat("w-candidate", "host", 2, "warming", models=["ab:candidate"]))
    assert (await api.get(CANARY)).json()["warnings"] == []
    assert (await api.delete(CANARY)).json()["warnings"] == []


async def _served_by(api: httpx.AsyncClient, variant: str) -> bool:
    """Whether a job submitted without a variant goes to `variant` now."""
    response = await api.post("/v1/jobs", json={"model": "ab", "inputs": {}})
    assert response.status_code == 202, response.text
    chosen: str = response.json()["variant"]
    return chosen == variant

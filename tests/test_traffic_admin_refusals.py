"""The live traffic admin API, the producer app in-process on a real Valkey (no worker, no
stack), its traffic leader running as in production: its refusals say what is wrong; two
operators who read the same version cannot both replace the routes (one is told, none is lost
in silence); the change log keeps only the latest changes however many are made; and a routing
key's variant comes from a stable hash, the same in every producer process (Python's `hash()`
is salted per process)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import LOG_LENGTH, RouteStore
from shared.routing import Routes, choose_variant
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import REPO_ROOT, until_async

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"
ROUTES = "/v1/models/ab/routes"
CANARY = "/v1/models/ab/canary"
AB = ModelRepository.load(TRAFFIC).models["ab"]


@pytest.fixture
async def api(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """`aredis` first: a clean keyspace before the app seeds the routes."""
    settings = Settings(
        redis_url=redis_url, model_repository=TRAFFIC, auth="disabled", instance_id="refusals"
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def test_weights_a_hair_short_of_100_say_by_how_much(api: httpx.AsyncClient) -> None:
    """Thirds typed to five places sum to 99.99999: the 422 said "must sum to 100, not 100"."""
    thirds = dict.fromkeys(("stable", "candidate", "flaky"), 33.33333)
    refused = await api.put(ROUTES, json={"weights": thirds})
    assert refused.status_code == 422, refused.text
    message = refused.json()["error"]["message"]
    assert message == "weights must sum to 100, not 99.99999", message


async def test_a_second_start_while_a_canary_runs_says_one_runs(api: httpx.AsyncClient) -> None:
    """The routes were judged before the running canary was noticed: they are that canary's,
    and a second start of its variant was told "candidate already serves 30 %...: is it the
    baseline?", as if variant and baseline were swapped."""
    first = {"variant": "candidate", "steps": [30, 100], "interval_s": 3600}
    started = await api.post(CANARY, json=first)
    assert started.status_code == 201, started.text

    async def stepped() -> bool:
        weights = (await api.get(ROUTES)).json()["weights"]
        return bool(weights.get("candidate") == 30)

    await until_async(stepped, timeout=10)  # the leader took the first step
    again = await api.post(CANARY, json={"variant": "candidate"})
    assert again.status_code == 409, again.text
    assert again.json()["error"]["message"] == "model ab has a canary running already"
    assert (await api.delete(CANARY)).status_code == 200


async def test_two_operators_naming_one_version_cannot_both_win(api: httpx.AsyncClient) -> None:
    version = (await api.get(ROUTES)).json()["version"]
    splits = [{"stable": 10, "candidate": 90}, {"stable": 90, "candidate": 10}]
    answers = await asyncio.gather(
        *(api.put(ROUTES, json={"weights": w, "expected_version": version}) for w in splits)
    )
    assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
    winner = splits[[a.status_code for a in answers].index(200)]
    shown = (await api.get(ROUTES)).json()
    assert shown["version"] == version + 1
    assert shown["weights"] == winner
    assert [change["new"]["weights"] for change in shown["history"][1:]] == [winner]


async def test_the_change_log_keeps_only_the_latest_changes(aredis: aioredis.Redis) -> None:
    store = RouteStore(aredis, Keys("r14-log:"))
    for _ in range(LOG_LENGTH + 3):
        await store.put("ab", Routes({"stable": 100.0}), "test")
    changes = await store.history("ab", LOG_LENGTH + 10)
    assert len(changes) == LOG_LENGTH
    assert (changes[0].version, changes[-1].version) == (4, LOG_LENGTH + 3)


def test_a_routing_key_lands_on_the_variant_its_hash_pins() -> None:
    """Pinned picks: a salted or otherwise changed hash would move users between producers
    (and on every deploy), and fails here."""
    routes = Routes({"stable": 50.0, "candidate": 30.0, "flaky": 20.0})
    picks = "".join(choose_variant(AB, None, f"user-{i}", routes)[0] for i in range(40))
    assert picks == "scssfcfscfffcssssscsscssscffccsssscsccfc"

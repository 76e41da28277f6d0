"""The live routes contract an operator relies on, on a real Valkey: two operators who read the
same version cannot both replace the routes (one is told, none is lost in silence), the change
log keeps only the latest changes however many are made, and a routing key's variant comes from
a stable hash, the same in every producer process (Python's `hash()` is salted per process)."""

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
from tests.conftest import REPO_ROOT

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"
AB = ModelRepository.load(TRAFFIC).models["ab"]
ROUTES = "/v1/models/ab/routes"


@pytest.fixture
async def api(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """`aredis` first: a clean keyspace before the app seeds the routes."""
    settings = Settings(
        redis_url=redis_url, model_repository=TRAFFIC, auth="disabled", instance_id="r14-routes"
    )
    async with app_client(create_app(settings)) as client:
        yield client


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

"""Refusals of the live traffic admin API say what is wrong: the producer app in-process on a
real Valkey (no worker, no stack), its traffic leader running as in production."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import REPO_ROOT, until_async

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"
ROUTES = "/v1/models/ab/routes"
CANARY = "/v1/models/ab/canary"


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

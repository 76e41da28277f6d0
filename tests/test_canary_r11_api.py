"""`POST /v1/models/{model}/canary` refuses what it cannot start with a 422 naming the field, on
a producer served in-process over a real Valkey (no worker: nothing is started)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import REPO_ROOT

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        redis_url=redis_url,
        auth="disabled",
        instance_id="canary-r11-api",
        model_repository=TRAFFIC,
    )
    async with app_client(create_app(settings)) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "words"),
    [
        # a typo in the baseline read as one in the variant
        (
            {"variant": "candidate", "baseline": "stabel"},
            'baseline: model ab has no variant "stabel"',
        ),
        (
            {"variant": "candidate", "baseline": "mirror"},
            "baseline: variant mirror of model ab is a shadow",
        ),
        ({"variant": "stable"}, "baseline: the canary and its baseline are one"),
    ],
)
async def test_a_start_refused_names_the_field(
    producer: httpx.AsyncClient, body: dict[str, Any], words: str
) -> None:
    response = await producer.post("/v1/models/ab/canary", json=body)
    assert response.status_code == 422, response.text
    assert words in response.json()["error"]["message"], response.text
    shown = await producer.get("/v1/models/ab/canary")
    assert shown.json()["canary"] is None, shown.text

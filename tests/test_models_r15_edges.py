"""`GET /v1/models` over a lane whose keys hold what no script writes (an operator's slip): a
fair lane's `held` that is no integer failed the read of every model (a 500 on the list, every
card and the console's Overview), and a submit stamp of minus infinity made the oldest age
infinite, which JSON cannot carry (it read null, where clients expect a number). A producer
served in-process over a real Valkey; no worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys()
STREAM = KEYS.queue("identity", "default")


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="models-r15")
    async with app_client(create_app(settings)) as client:
        yield client


async def _default_lane(producer: httpx.AsyncClient) -> dict[str, Any]:
    """identity's default partition, as its card shows it and as the list does (the same but
    for the age, read a moment later)."""
    response = await producer.get("/v1/models/identity")
    assert response.status_code == 200, response.text
    [partition] = [p for p in response.json()["partitions"] if p["variant"] == "default"]
    listing = await producer.get("/v1/models")
    assert listing.status_code == 200, listing.text
    [card] = [c for c in listing.json()["data"] if c["id"] == "identity"]
    [listed] = [p for p in card["partitions"] if p["variant"] == "default"]
    assert {**listed, "oldest_queued_age_s": 0} == {**partition, "oldest_queued_age_s": 0}
    assert {"minilm", "smollm2"} <= {c["id"] for c in listing.json()["data"]}
    return dict(partition)


async def test_a_held_count_that_is_no_integer_fails_no_model(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    await aredis.xadd(STREAM, {"id": "j1", "enq": "1"})
    for written in ("2.5", "many"):
        await aredis.hset(KEYS.fair(STREAM), "held", written)
        lane = await _default_lane(producer)
        assert (lane["length"], lane["lag"]) == (1, 1), lane  # the stream's entry, nothing held


async def test_a_submit_stamp_of_minus_infinity_reads_as_no_age(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    await aredis.xadd(STREAM, {"id": "j1", "enq": "-inf"})
    lane = await _default_lane(producer)
    assert lane["oldest_queued_age_s"] == 0.0, lane  # as an entry with no stamp reads
    assert lane["lag"] == 1

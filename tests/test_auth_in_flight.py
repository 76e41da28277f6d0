"""A key's in-flight cap against a producer run in-process on a real Valkey, with no worker: a
job queued past its deadline can only expire, yet it held its slot until a worker read it, so
jobs waiting on a partition no worker serves kept their key from submitting to any model."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.api_keys import ApiKeyStore, KeySpec
from shared.job_store import now_ms
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("auth-in-flight:")
STRANDED = {"model": "identity", "inputs": {"x": 1}, "ttl_s": 60}
ELSEWHERE = {"model": "minilm", "inputs": {"texts": ["hello"]}}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database: auth on, a key of one in-flight slot."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="enabled"))
    spec = KeySpec("acme", frozenset({"submit", "read"}), max_in_flight=1)
    key, _ = await ApiKeyStore(aredis, KEYS).create(spec)
    async with app_client(app) as client:
        client.headers["Authorization"] = f"Bearer {key}"
        yield client


async def _stranded(producer: httpx.AsyncClient) -> str:
    accepted = await producer.post("/v1/jobs", json=STRANDED)
    assert accepted.status_code == 202, accepted.text
    job_id: str = accepted.json()["id"]
    return job_id


async def test_a_job_queued_within_its_deadline_holds_its_slot(
    producer: httpx.AsyncClient,
) -> None:
    await _stranded(producer)
    refused = await producer.post("/v1/jobs", json=ELSEWHERE)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["type"] == "too_many_in_flight"


async def test_a_job_queued_past_its_deadline_frees_its_slot(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    job_id = await _stranded(producer)
    # a minute on: the job's deadline long past, and no worker has read it to expire it
    await aredis.hset(KEYS.job(job_id), "deadline", now_ms() - 60_000)
    accepted = await producer.post("/v1/jobs", json=ELSEWHERE)
    assert accepted.status_code == 202, accepted.text
    # the slot went to the new job: the next one is refused again
    assert (await producer.post("/v1/jobs", json=ELSEWHERE)).status_code == 429

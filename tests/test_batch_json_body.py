"""A JSON body to `POST /v1/batches`: OpenAI's create names its lines by `input_file_id`; one that
omits it (an OpenAI Batch API user's slip) is refused naming the field, where it was read as a
one-line JSONL batch and answered 202 with a batch that failed. A one-line batch sent as
`application/json` (a line's own `custom_id` and `body`) still runs. A producer run in-process
on a real Valkey, under keys of its own: no worker reads its lanes."""

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

KEYS = Keys("batch-json:")


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled"))
    async with app_client(app) as client:
        yield client


@pytest.mark.parametrize(
    "body",
    [
        {"endpoint": "/v1/chat/completions", "completion_window": "24h"},
        {"endpoint": "/v1/embeddings", "completion_window": "24h", "metadata": {"run": "7"}},
        {"completion_window": "24h"},
    ],
)
async def test_an_openai_create_without_its_file_is_refused_naming_it(
    producer: httpx.AsyncClient, aredis: aioredis.Redis, body: dict[str, Any]
) -> None:
    refused = await producer.post("/v1/batches", json=body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and "input_file_id" in error["message"]
    assert await aredis.keys(f"{KEYS.prefix}*batch*") == []  # nothing stored


async def test_a_one_line_batch_sent_as_json_still_runs(producer: httpx.AsyncClient) -> None:
    line = {"custom_id": "only", "body": {"inputs": {"n": 1}}}
    created = await producer.post("/v1/batches", params={"model": "identity"}, json=line)
    assert created.status_code == 202, created.text
    batch = created.json()
    assert batch["status"] == "in_progress" and batch["counts"]["total"] == 1, batch
    assert batch["counts"]["invalid"] == 0

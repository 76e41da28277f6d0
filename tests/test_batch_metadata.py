"""OpenAI's batch `metadata` on Conveyor's own creates (a JSONL body, a multipart upload), whose
options travel as query parameters or form fields: `metadata[KEY]=VALUE` per pair, as OpenAI's
`output_expires_after[...]` travels there. Only OpenAI's JSON create (`input_file_id`) could
send metadata. A producer run in-process on a real Valkey, under keys of its own: no worker
reads its lanes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("batch-metadata:")
LINES = b'{"custom_id": "a", "body": {"model": "identity", "inputs": {"x": 1}}}\n'
PAIRS = {"run": "7", "team": "search [eu]", "empty": ""}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled"))
    async with app_client(app) as client:
        yield client


async def _create(producer: httpx.AsyncClient, way: str, pairs: dict[str, str]) -> httpx.Response:
    fields = {f"metadata[{key}]": value for key, value in pairs.items()}
    if way == "query":
        headers = {"Content-Type": "application/jsonl"}
        return await producer.post("/v1/batches", params=fields, content=LINES, headers=headers)
    return await producer.post("/v1/batches", data=fields, files={"file": ("b.jsonl", LINES)})


@pytest.mark.parametrize("way", ["query", "form"])
async def test_a_create_that_sends_its_lines_keeps_its_metadata(
    producer: httpx.AsyncClient, way: str
) -> None:
    created = await _create(producer, way, PAIRS)
    assert created.status_code == 202, created.text
    assert created.json()["metadata"] == PAIRS
    shown = await producer.get(f"/v1/batches/{created.json()['id']}")
    assert shown.json()["metadata"] == PAIRS


@pytest.mark.parametrize("way", ["query", "form"])
@pytest.mark.parametrize(
    ("pairs", "needle"),
    [
        ({f"k{i}": "v" for i in range(17)}, "at most 16 items"),
        ({"k" * 65: "v"}, "at most 64 characters"),
        ({"k": "v" * 513}, "at most 512 characters"),
    ],
)
async def test_metadata_outside_openais_bounds_is_refused_by_name(
    producer: httpx.AsyncClient,
    aredis: aioredis.Redis,
    way: str,
    pairs: dict[str, str],
    needle: str,
) -> None:
    refused = await _create(producer, way, pairs)
    assert refused.status_code == 422, refused.text
    assert needle in refused.text and "metadata" in refused.text, refused.text
    assert await aredis.keys(KEYS.batch("*")) == []

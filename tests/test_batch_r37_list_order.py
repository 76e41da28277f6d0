"""`GET /v1/batches` lists newest first by each batch's `created_at`, as OpenAI's does, not by
when its create finished: a big batch created before a small one, whose create ended after the
small one's, listed as the newer, and a client paging after the small one (listed while the big
one was still validating) never saw the big one. A producer run in-process on a real Valkey, no
worker (the big batch's items wait in the bulk lane or are held)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.codec import as_text
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client, openai_sdk
from tests.conftest import until_async

KEYS = Keys("batch-order:")
LINE = b'{"custom_id": "%d", "body": {"model": "identity", "inputs": {"x": 1}}}\n'
BIG = 5_000  # lines: its create runs long after its hash is written


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        yield client


async def _create(producer: httpx.AsyncClient, lines: int) -> str:
    body = b"".join(LINE % i for i in range(lines))
    headers = {"Content-Type": "application/jsonl"}
    created = await producer.post("/v1/batches", content=body, headers=headers)
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


async def _validating(aredis: aioredis.Redis) -> list[str]:
    """The ids of the batches whose create has not finished."""
    keys = await aredis.keys(KEYS.batch("batch_*"))
    return [
        re.sub(r".*(batch_[0-9a-f]{32}).*", r"\1", as_text(key))
        for key in keys
        if await aredis.hget(key, "status") == b"validating"
    ]


async def test_batches_list_by_created_at_and_page_on_across_a_slow_create(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    sdk: openai.AsyncOpenAI = openai_sdk(producer)
    big_create = asyncio.create_task(_create(producer, BIG))
    [big] = await until_async(lambda: _validating(aredis), every=0.01)
    small = await _create(producer, 1)
    first = await sdk.batches.list(limit=1)
    assert await _validating(aredis) == [big]  # both answered before the big one's create ended
    assert await big_create == big
    assert [b.id for b in first.data] == [small]
    # the big one, created first, is the older, so the page after the small one holds it
    after = await sdk.batches.list(limit=1, after=small)
    assert [b.id for b in after.data] == [big] and not after.has_more
    listed = (await sdk.batches.list()).data
    assert [b.id for b in listed] == [small, big]
    assert listed[0].created_at >= listed[1].created_at

"""`error.code` of an OpenAI-route batch's errors-file line: OpenAI's `batch_cancelled` or
`batch_expired` only for a line its batch's own cancel or expiry stopped, else the error's own
type. It was picked from the item's status alone, so a job cancelled on its own
(`DELETE /v1/jobs/{id}`) read `batch_cancelled`, and one past its line's own deadline
`batch_expired`. A producer run in-process on a real Valkey, under keys of its own: no worker
reads its lanes, so every line waits until something ends it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.codec import dumps
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async

KEYS = Keys("error-codes:")
LINE = {"url": "/v1/completions", "body": {"model": "smollm2", "prompt": "word", "max_tokens": 2}}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled"))
    async with app_client(app) as client:
        yield client


async def _batch(client: httpx.AsyncClient, aredis: aioredis.Redis, lines: int) -> list[str]:
    """A running batch of `lines` completion lines: its id, then its items' job ids."""
    source = "".join(json.dumps({"custom_id": f"c{n}", **LINE}) + "\n" for n in range(lines))
    headers = {"Content-Type": "application/jsonl"}
    created = await client.post("/v1/batches", content=source, headers=headers)
    assert created.status_code == 202, created.text
    batch_id = created.json()["id"]
    items = await aredis.lrange(KEYS.batch_items(batch_id), 0, -1)
    return [batch_id, *(job_id.decode() for job_id in items)]


async def _codes(client: httpx.AsyncClient, batch_id: str) -> list[tuple[Any, ...]]:
    errors = await client.get(f"/v1/batches/{batch_id}/errors")
    assert errors.status_code == 200, errors.text
    lines = [json.loads(line) for line in errors.text.splitlines()]
    return [(e["custom_id"], e["status"], e["error"]["code"]) for e in lines]


async def test_a_line_cancelled_on_its_own_keeps_its_code_in_a_cancelled_batch(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    batch_id, alone, _ = await _batch(producer, aredis, 2)
    assert (await producer.delete(f"/v1/jobs/{alone}")).status_code == 200
    cancelled = await producer.post(f"/v1/batches/{batch_id}/cancel")
    assert cancelled.json()["status"] == "cancelled", cancelled.text
    assert await _codes(producer, batch_id) == [
        ("c0", "cancelled", "cancelled"),
        ("c1", "cancelled", "batch_cancelled"),
    ]


async def test_only_the_lines_the_window_stopped_are_batch_expired(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """Workers expire an item they read past its deadline (DeadlineExceeded): its line's own,
    earlier than the window's end, keeps that code; the batch's own expiry is `batch_expired`,
    whether a worker or the sweeper came first."""
    batch_id, own, window, _ = await _batch(producer, aredis, 3)
    deadline = int(await aredis.hget(KEYS.job(own), "deadline") or 0)
    error = dumps({"type": "DeadlineExceeded", "message": "job expired before it could run"})
    for job_id, its_deadline in ((own, deadline - 60_000), (window, deadline)):
        ended = {"status": "expired", "error": error, "deadline": its_deadline}
        await aredis.hset(KEYS.job(job_id), mapping=ended)  # as the worker that read it wrote
    await aredis.zadd(KEYS.batches_active, {batch_id: 0})  # the window has run out

    async def expired() -> bool:
        batch = await producer.get(f"/v1/batches/{batch_id}")
        return bool(batch.json()["status"] == "expired")

    await until_async(expired, timeout=30)
    assert await _codes(producer, batch_id) == [
        ("c0", "expired", "DeadlineExceeded"),
        ("c1", "expired", "batch_expired"),
        ("c2", "expired", "batch_expired"),
    ]

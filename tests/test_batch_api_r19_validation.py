"""A batch create's options against OpenAI's rules, and its finalizer's commit against the
batch's own statuses. `metadata` took an empty key, which OpenAI's rules (keys of 1 to 64
characters) refuse: refused now as a key past 64 characters is, by each way a create sends it.
COMMIT keeps a batch that has ended, whatever its end, and writes over one still running: its
Lua spelled the ended statuses out again, apart from `BatchStatus.terminal`, so a status added
to one and not the other was written over (or kept) wrongly. A producer run in-process on a
real Valkey, under keys of its own: no worker reads its lanes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared import batch_api_scripts
from shared.batch_api_store import BatchStatus
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("batch-r19:")
LINE = b'{"custom_id": "a", "body": {"model": "identity", "inputs": {"x": 1}}}\n'


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled"))
    async with app_client(app) as client:
        yield client


async def _create(
    producer: httpx.AsyncClient, way: str, metadata: dict[str, str]
) -> httpx.Response:
    """A create by `way`: Conveyor's JSONL body (query parameters) or multipart upload (form
    fields), or OpenAI's JSON body naming an uploaded file."""
    if way == "json":
        upload = await producer.post(
            "/v1/files", files={"file": ("b.jsonl", LINE)}, data={"purpose": "batch"}
        )
        body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/jobs", "metadata": metadata}
        return await producer.post("/v1/batches", json=body)
    fields = {f"metadata[{key}]": value for key, value in metadata.items()}
    if way == "query":
        headers = {"Content-Type": "application/jsonl"}
        return await producer.post("/v1/batches", params=fields, content=LINE, headers=headers)
    return await producer.post("/v1/batches", data=fields, files={"file": ("b.jsonl", LINE)})


@pytest.mark.parametrize(("way", "status"), [("query", 422), ("form", 422), ("json", 400)])
async def test_a_metadata_key_that_is_empty_is_refused_by_name(
    producer: httpx.AsyncClient, aredis: aioredis.Redis, way: str, status: int
) -> None:
    refused = await _create(producer, way, {"": "v", "run": "7"})
    assert refused.status_code == status, refused.text
    error = refused.json()["error"]
    assert error["message"].startswith("metadata") and "at least 1 character" in error["message"]
    if way == "json":  # OpenAI's shape names the field, as its SDK reads it
        assert error["type"] == "invalid_request_error" and error["param"].startswith("metadata")
    assert await aredis.keys(KEYS.batch("*")) == []


async def test_commit_keeps_every_ended_status_and_writes_over_the_others(
    aredis: aioredis.Redis,
) -> None:
    commit = aredis.register_script(batch_api_scripts.COMMIT)
    key = KEYS.batch("batch_commit")
    for status in BatchStatus:
        await aredis.hset(key, mapping={"status": status.value})
        ending = ["status", "completed", "completed_at", "1"]
        kept = await commit(keys=[key], args=[60, 2_000_000_000, *ending])
        assert kept.decode() == (status.value if status.terminal else "completed"), status
        written = (await aredis.hget(key, "status")).decode()
        assert written == (status.value if status.terminal else "completed"), status

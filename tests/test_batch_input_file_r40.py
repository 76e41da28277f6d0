"""A batch's `input_file_id`: the id of the uploaded file OpenAI's create named, and null for a
batch whose lines came in the create itself (a JSONL or multipart body, Conveyor's own forms):
there is no file, and none is made up (it would store the lines twice and charge them to the
tenant's file budget). OpenAI's SDK reads null as None; only its strict response validation
refuses such a batch (README, Batch API). A producer run in-process on a real Valkey, under keys
of its own: no worker reads its lanes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client, openai_sdk

KEYS = Keys("r40-input-file:")
LINES = b'{"custom_id": "a", "body": {"model": "identity", "inputs": {"x": 1}}}\n'
CREATE = {"endpoint": "/v1/jobs", "completion_window": "24h", "model": "identity"}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        yield client


async def test_a_batch_sent_as_a_body_names_no_input_file_and_stores_none(
    producer: httpx.AsyncClient,
) -> None:
    jsonl = {"Content-Type": "application/jsonl"}
    created = await producer.post("/v1/batches", content=LINES, headers=jsonl)
    assert created.status_code == 202, created.text
    batch_id = created.json()["id"]
    assert created.json()["input_file_id"] is None
    read = await producer.get(f"/v1/batches/{batch_id}")
    assert read.json()["input_file_id"] is None
    listed = await producer.get("/v1/batches")
    assert [(b["id"], b["input_file_id"]) for b in listed.json()["data"]] == [(batch_id, None)]
    assert (await producer.get("/v1/files")).json()["data"] == []  # no file made up

    sdk = openai_sdk(producer)
    assert (await sdk.batches.retrieve(batch_id)).input_file_id is None
    assert [b.input_file_id async for b in sdk.batches.list()] == [None]
    strict = sdk.with_options()
    strict._strict_response_validation = True
    with pytest.raises(openai.APIResponseValidationError) as refused:
        await strict.batches.retrieve(batch_id)
    cause = refused.value.__cause__
    assert isinstance(cause, ValidationError), cause
    assert [error["loc"] for error in cause.errors()] == [("input_file_id",)], cause


async def test_a_batch_made_from_an_upload_names_it_and_its_content_is_the_lines(
    producer: httpx.AsyncClient,
) -> None:
    files = {"file": ("lines.jsonl", LINES)}
    uploaded = await producer.post("/v1/files", files=files, data={"purpose": "batch"})
    assert uploaded.status_code == 200, uploaded.text
    file_id = uploaded.json()["id"]
    created = await producer.post("/v1/batches", json={"input_file_id": file_id, **CREATE})
    assert created.status_code == 202, created.text
    read = await producer.get(f"/v1/batches/{created.json()['id']}")
    assert read.json()["input_file_id"] == file_id
    assert (await producer.get(f"/v1/files/{file_id}/content")).content == LINES

"""What the openai SDK sends to the Files API and the Batch API (create by `input_file_id`,
list, retrieve, cancel) is refused as OpenAI's API refuses it: 400 `invalid_request_error`
naming the `param`, which the SDK raises as BadRequestError. They answered Conveyor's 422, and
`except openai.BadRequestError` missed every one. A create that sends its lines itself (a JSONL
body, a multipart file: Conveyor's own) keeps its 422. A producer served in-process over a real
Valkey; nothing reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client

LINE = b'{"custom_id": "a", "url": "/v1/embeddings", "body": {"model": "minilm", "input": "x"}}\n'


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="batch-400")
    async with app_client(create_app(settings)) as client:
        yield client


@pytest.fixture
def sdk(producer: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://test/v1", api_key="unused", http_client=producer, max_retries=0
    )


async def _refused_param(call: Awaitable[object]) -> str | None:
    with pytest.raises(openai.BadRequestError) as refused:
        await call
    assert refused.value.type == "invalid_request_error" and refused.value.message
    return refused.value.param


async def test_the_sdk_raises_bad_request_naming_the_param(sdk: openai.AsyncOpenAI) -> None:
    upload = await sdk.files.create(file=("in.jsonl", LINE), purpose="batch")
    files, batches = sdk.files, sdk.batches
    refusals = [
        files.create(file=("in.jsonl", LINE), purpose="fine-tune"),
        files.create(file=("in.jsonl", b"\n"), purpose="batch"),
        files.list(limit=0),
        files.retrieve("f" * 65),
        batches.create(
            input_file_id=upload.id,
            endpoint="/v1/responses",
            completion_window="24h",
        ),
        batches.create(
            input_file_id=upload.id,
            endpoint="/v1/embeddings",
            completion_window="48h",  # type: ignore[arg-type]
        ),
        batches.list(limit=101),
        batches.retrieve("b" * 65),
        batches.cancel("b" * 65),
    ]
    params = [await _refused_param(call) for call in refusals]
    assert params == [
        "purpose",
        "file",
        "limit",
        "file_id",
        "endpoint",
        "completion_window",
        "limit",
        "batch_id",
        "batch_id",
    ]


async def test_a_json_create_without_its_file_is_openais_400(
    producer: httpx.AsyncClient,
) -> None:
    refused = await producer.post("/v1/batches", json={"completion_window": "24h"})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "input_file_id",
        None,
    )


async def test_a_json_creates_malformed_idempotency_key_is_openais_400(
    sdk: openai.AsyncOpenAI,
) -> None:
    """Its key was read before its body told it OpenAI's create: Conveyor's 422."""
    create = sdk.batches.create(
        input_file_id=f"file-{'0' * 32}",
        endpoint="/v1/embeddings",
        completion_window="24h",
        extra_headers={"Idempotency-Key": "a b"},
    )
    assert await _refused_param(create) is None


async def test_a_create_sending_its_lines_keeps_conveyors_422(
    producer: httpx.AsyncClient,
) -> None:
    jsonl = await producer.post(
        "/v1/batches",
        params={"completion_window": "48h"},
        content=LINE,
        headers={"content-type": "application/jsonl"},
    )
    multipart = await producer.post("/v1/batches", files={"lines": ("in.jsonl", LINE)})
    for refused in (jsonl, multipart):
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"].keys() == {"type", "message"}

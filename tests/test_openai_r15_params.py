"""Parameters OpenAI's API refuses, refused here too (400 in OpenAI's shape, `param` naming the
field) rather than silently ignored or enqueued: a chat's `best_of` (vLLM's chat took it; it
was dropped, one choice answered where the best of several was asked for). A producer served
in-process over a real Valkey; nothing reaches a worker, and nothing refused is enqueued."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.openai.protocol import ChatCompletionRequest
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

CHAT = "/v1/chat/completions"


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="openai-r15-params")
    async with app_client(create_app(settings)) as client:
        yield client


async def _refused_param(
    producer: httpx.AsyncClient, aredis: aioredis.Redis, path: str, body: dict[str, Any]
) -> str:
    """The 400's `param`, once it is seen that the request is OpenAI's error and enqueued
    nothing."""
    lanes = [Keys().queue(model, "default") for model in ("smollm2", "minilm")]
    before = [await aredis.xlen(lane) for lane in lanes]
    with anyio.fail_after(5):  # one accepted waits for its job's answer, which no worker gives
        answer = await producer.post(path, json=body)
    assert answer.status_code == 400, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] is None, error
    assert [await aredis.xlen(lane) for lane in lanes] == before
    param: str = error["param"]
    return param


async def test_a_chats_best_of_past_one_is_refused_naming_it(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """It was accepted and dropped: one sampled choice answered as the best of two."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "best_of": 2}
    assert await _refused_param(producer, aredis, CHAT, body) == "best_of"


async def test_max_completion_tokens_counts_over_max_tokens_as_documented(
    producer: httpx.AsyncClient,
) -> None:
    """vLLM's precedence, which the API's schema did not say: a client sending both could not
    tell which one its answer was cut at."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
    both = ChatCompletionRequest.model_validate(
        {**body, "max_tokens": 5, "max_completion_tokens": 7}
    )
    assert both.parameters()["max_tokens"] == 7
    schema = (await producer.get("/openapi.json")).json()["components"]["schemas"]
    field = schema["ChatCompletionRequest"]["properties"]["max_completion_tokens"]
    assert "sent with max_tokens, this one counts" in field["description"], field

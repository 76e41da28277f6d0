"""Refusals on OpenAI's routes name the field refused in `param`, as OpenAI's API does, and say
why in plain words: OpenAI's SDK users read `e.param`, which these refusals left None, and an
image part's refusal read as a malformed text part. A producer served in-process over a real
Valkey; nothing reaches a worker, and nothing refused is enqueued."""

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

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
HI = [{"role": "user", "content": "hi"}]
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="openai-edges-r8")
    async with app_client(create_app(settings)) as client:
        yield client


async def _refusal(
    producer: httpx.AsyncClient, aredis: aioredis.Redis, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    """The 400's error in OpenAI's shape, once it is seen that the request enqueued nothing."""
    lanes = [Keys().queue(model, "default") for model in ("smollm2", "minilm")]
    before = [await aredis.xlen(lane) for lane in lanes]
    answer = await producer.post(path, json=body)
    assert answer.status_code == 400, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error.keys() == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["code"] is None, error
    assert [await aredis.xlen(lane) for lane in lanes] == before
    return error


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("stream", [{}, {"stream": False}, {"stream": None}])
async def test_stream_options_without_a_stream_is_refused_naming_it(
    producer: httpx.AsyncClient, aredis: aioredis.Redis, path: str, stream: dict[str, Any]
) -> None:
    """As OpenAI's API answers it (`param` "stream_options"): it was `param` null, its message
    "body: Value error, ..."."""
    asked = {"messages": HI} if path == CHAT else {"prompt": "Once"}
    body = {"model": "smollm2", **asked, **stream, "stream_options": {"include_usage": True}}
    error = await _refusal(producer, aredis, path, body)
    assert error["param"] == "stream_options", error
    assert error["message"] == "stream_options: only allowed when stream is true", error


@pytest.mark.parametrize(
    ("content", "where", "kind"),
    [
        ([{"type": "text", "text": "What is this?"}, IMAGE], "messages.0.content.1", "image_url"),
        ([{"type": "input_audio", "input_audio": {}}], "messages.0.content.0", "input_audio"),
    ],
)
async def test_a_part_other_than_text_is_refused_saying_only_text_is_read(
    producer: httpx.AsyncClient,
    aredis: aioredis.Redis,
    content: list[dict[str, Any]],
    where: str,
    kind: str,
) -> None:
    """It read "content.1.type: Input should be 'text'; content.1.text: Field required", as if
    a text part were malformed."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": content}]}
    error = await _refusal(producer, aredis, CHAT, body)
    assert error["param"] == where, error
    assert error["message"] == f"{where}: {kind} parts are not taken: the model reads text only"


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        (CHAT, {"model": "minilm", "messages": HI}, "does not generate text"),
        (COMPLETIONS, {"model": "identity", "prompt": "Once"}, "does not generate text"),
        (EMBEDDINGS, {"model": "smollm2", "input": "x"}, "does not embed text"),
    ],
)
async def test_a_model_the_route_cannot_run_is_refused_naming_the_model(
    producer: httpx.AsyncClient, aredis: aioredis.Redis, path: str, body: dict[str, Any], says: str
) -> None:
    """As OpenAI's API refuses an embedding model on its chat route (`param` "model")."""
    error = await _refusal(producer, aredis, path, body)
    assert error["param"] == "model" and says in error["message"], error


async def test_dimensions_are_refused_naming_them(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """Its message began "dimensions:", its `param` was null."""
    body = {"model": "minilm", "input": "x", "dimensions": 384}
    error = await _refusal(producer, aredis, EMBEDDINGS, body)
    assert error["param"] == "dimensions" and "whole vectors only" in error["message"], error

"""vLLM's own request parameters that Conveyor does not honour (its embeddings' and prompts'
`truncate_prompt_tokens`, `add_special_tokens` against the route's default, special-token
detokenizing, token ids in the answer, `priority`) are refused by name (400 in OpenAI's shape),
not silently ignored: the client got another answer than the one it asked for. Their defaults
are taken. A producer served in-process over a real Valkey; nothing refused is enqueued."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
)
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_openai_r15_params import _refused_param

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "smollm2", "prompt": "hi"}
EMBEDDING = {"model": "minilm", "input": "hi"}
ROUTES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETION,
    "/v1/embeddings": EMBEDDING,
}
REFUSED: list[tuple[str, str, Any]] = [
    ("/v1/embeddings", "truncate_prompt_tokens", 3),
    ("/v1/embeddings", "add_special_tokens", False),
    ("/v1/embeddings", "priority", 1),
    ("/v1/embeddings", "embed_dtype", "float16"),
    ("/v1/completions", "truncate_prompt_tokens", -1),
    ("/v1/completions", "add_special_tokens", False),
    ("/v1/completions", "skip_special_tokens", False),
    ("/v1/chat/completions", "add_special_tokens", True),
    ("/v1/chat/completions", "return_token_ids", True),
]


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="openai-r23-vllm")
    async with app_client(create_app(settings)) as client:
        yield client


async def test_vllms_parameters_not_honoured_are_refused_by_name(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    for path, name, value in REFUSED:
        body = {**ROUTES[path], name: value}
        assert await _refused_param(producer, aredis, path, body) == name, (path, name)


def test_vllms_defaults_are_taken() -> None:
    """What vLLM's server does by default is what the engine does: sent, it is no refusal."""
    defaults = {"truncate_prompt_tokens": None, "priority": 0}
    EmbeddingRequest.model_validate(
        {**EMBEDDING, **defaults, "add_special_tokens": True, "embed_dtype": "float32"}
    )
    CompletionRequest.model_validate(
        {**COMPLETION, **defaults, "add_special_tokens": True, "skip_special_tokens": True}
    )
    ChatCompletionRequest.model_validate({**CHAT, **defaults, "add_special_tokens": False})

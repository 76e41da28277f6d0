"""An invalid request to OpenAI's routes answers as OpenAI's API and vLLM's server do: 400
`{"error": {"message", "type": "invalid_request_error", "param", "code"}}`, which OpenAI's SDK
raises as BadRequestError. They answered Conveyor's 422 (`UnprocessableEntityError`), and a
client's `except openai.BadRequestError` missed every bad request. The native routes keep their
422. A producer served in-process over a real Valkey; nothing reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="openai-400")
    async with app_client(create_app(settings)) as client:
        yield client


@pytest.fixture
def sdk(producer: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://test/v1", api_key="unused", http_client=producer, max_retries=0
    )


async def test_the_sdk_raises_bad_request_naming_the_param(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as chat:
        await sdk.chat.completions.create(
            model="smollm2",
            messages=MESSAGES,  # type: ignore[arg-type]
            temperature="hot",  # type: ignore[arg-type]
        )
    with pytest.raises(openai.BadRequestError) as embed:
        await sdk.embeddings.create(model="minilm", input=[1, 2, 3], encoding_format="float")
    assert (chat.value.type, chat.value.param, chat.value.code) == (
        "invalid_request_error",
        "temperature",
        None,
    )
    assert embed.value.type == "invalid_request_error" and "token" in embed.value.message


async def test_n_choices_are_refused_saying_to_send_n_requests(sdk: openai.AsyncOpenAI) -> None:
    """vLLM's server answers `n` > 1 choices; the refusal read "n: Input should be 1"."""
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.chat.completions.create(
            model="smollm2",
            messages=MESSAGES,  # type: ignore[arg-type]
            n=2,
            max_tokens=4,
        )
    assert refused.value.param == "n" and "send 2 requests" in refused.value.message, refused


async def test_a_prompt_of_token_ids_is_refused_saying_to_send_text(
    sdk: openai.AsyncOpenAI,
) -> None:
    """vLLM's server takes token ids; the refusal read "prompt.list.0: Input should be a valid
    string" for each, as if the prompt were a malformed string."""
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.completions.create(model="smollm2", prompt=[1, 2, 3], max_tokens=4)
    assert refused.value.param == "prompt" and "token ids" in refused.value.message, refused


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", b"{bad"),  # refused by the request boundary, before any route
        ("/v1/completions", b'{"model": "smollm2", "prompt": ["a", "b"]}'),
        ("/v1/embeddings", b'{"model": "minilm"}'),
        ("/v1/chat/completions", b'{"model": "smollm2", "messages": [], "logprobs": true}'),
    ],
)
async def test_every_bad_request_is_openais_400(
    producer: httpx.AsyncClient, path: str, body: bytes
) -> None:
    answer = await producer.post(path, content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error.keys() == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["message"], error


async def test_the_native_routes_keep_their_422(producer: httpx.AsyncClient) -> None:
    malformed = await producer.post(
        "/v1/jobs", content=b"{bad", headers={"content-type": "application/json"}
    )
    unknown = await producer.post("/v1/jobs", json={"model": "identity", "inputs": {}, "x": 1})
    assert [malformed.status_code, unknown.status_code] == [422, 422]
    assert unknown.json()["error"] == {
        "type": "invalid_request",
        "message": "x: Extra inputs are not permitted",
    }

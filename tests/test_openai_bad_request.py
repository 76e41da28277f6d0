"""An invalid request to OpenAI's routes answers as OpenAI's API and vLLM's server do: 400
`{"error": {"message", "type": "invalid_request_error", "param", "code"}}`, which OpenAI's SDK
raises as BadRequestError. They answered Conveyor's 422 (`UnprocessableEntityError`), and a
client's `except openai.BadRequestError` missed every bad request. The native routes keep their
422. So does what the SDK sends to the Files API and the Batch API (create by `input_file_id`,
list, retrieve, cancel); a batch create that sends its lines itself (a JSONL body, a multipart
file: Conveyor's own) keeps its 422. A producer served in-process over a real Valkey; nothing
reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client, openai_sdk

MESSAGES = [{"role": "user", "content": "hi"}]
LINE = b'{"custom_id": "a", "url": "/v1/embeddings", "body": {"model": "minilm", "input": "x"}}\n'


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="openai-400")
    async with app_client(create_app(settings)) as client:
        yield client


@pytest.fixture
def sdk(producer: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai_sdk(producer)


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


@pytest.mark.parametrize(
    ("asked", "param", "says"),
    [
        ({"max_completion_tokens": 1025}, "max_completion_tokens", "max_completion_tokens: at"),
        ({"max_tokens": 1025}, "max_tokens", "max_tokens: at most 1024"),
        (
            {"max_completion_tokens": 4, "extra_body": {"min_tokens": 5}},
            "min_tokens",
            "min_tokens: at most max_completion_tokens (4)",
        ),
    ],
)
async def test_a_refused_token_count_is_named_as_the_client_sent_it(
    sdk: openai.AsyncOpenAI, asked: dict[str, Any], param: str, says: str
) -> None:
    """Past smollm2's max_tokens_limit (1024): the refusal named the job's
    `parameters.max_tokens` (a chat's `max_completion_tokens` is its `max_tokens`), with no
    `param`."""
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.chat.completions.create(
            model="smollm2",
            messages=MESSAGES,  # type: ignore[arg-type]
            **asked,
        )
    assert refused.value.param == param and says in refused.value.message, refused


LONG = "x" * 20_001  # past smollm2's 16000 characters a text, and minilm's 20000


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": "smollm2", "prompt": LONG}, "prompt"),
        (
            "/v1/chat/completions",
            {"model": "smollm2", "messages": [{"role": "user", "content": LONG}]},
            "messages.0.content",
        ),
        ("/v1/embeddings", {"model": "minilm", "input": LONG}, "input"),
        ("/v1/embeddings", {"model": "minilm", "input": ["a", LONG]}, "input.1"),
    ],
)
async def test_an_input_the_models_schema_refuses_is_named_as_the_client_sent_it(
    producer: httpx.AsyncClient, path: str, body: dict[str, Any], param: str
) -> None:
    """The refusal named the job's inputs (`inputs['prompt']`; `inputs['texts'][0]` for one
    `input` text), with no `param`."""
    answer = await producer.post(path, json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: "), error


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


async def _refused_param(call: Awaitable[object]) -> str | None:
    with pytest.raises(openai.BadRequestError) as refused:
        await call
    assert refused.value.type == "invalid_request_error" and refused.value.message
    return refused.value.param


async def test_the_files_and_batch_apis_refuse_as_openai_naming_the_param(
    sdk: openai.AsyncOpenAI,
) -> None:
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

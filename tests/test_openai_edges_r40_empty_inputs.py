"""Empty inputs are refused as OpenAI's API refuses them: an embeddings `input` of "" (alone or in
a list), which OpenAI's spec says "cannot be an empty string", and a chat message's `content` as
an empty list of parts (OpenAI's `minItems: 1`), or as null but for an assistant's turn. Conveyor
took them (their job enqueued): the text embedded as its special tokens alone, the message read
as empty. Each is now a 400 `invalid_request_error` naming the field as sent (`param`), which
OpenAI's SDK raises as BadRequestError, and nothing is enqueued. A producer served in-process over
a real Valkey; nothing reaches a worker (a request taken would wait: the timeout below fails it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client, openai_sdk

KEYS = Keys("cv:")
# a request taken waits for a worker that never comes here: a failure, not a hang
pytestmark = pytest.mark.timeout(10)


@pytest.fixture
async def sdk(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[openai.AsyncOpenAI]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="openai-r40")
    async with app_client(create_app(settings)) as client:
        yield openai_sdk(client)


async def _queued(aredis: aioredis.Redis, model: str) -> int:
    return int(await aredis.xlen(KEYS.queue(model, "default")))


@pytest.mark.parametrize(
    ("text", "param"),
    [("", "input"), ([""], "input.0"), (["a text", ""], "input.1")],
)
@pytest.mark.parametrize("encoding_format", ["float", "base64"])
async def test_an_empty_text_to_embed_is_refused_naming_it(
    sdk: openai.AsyncOpenAI,
    aredis: aioredis.Redis,
    text: str | list[str],
    param: str,
    encoding_format: str,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.embeddings.create(
            model="minilm",
            input=text,
            encoding_format=encoding_format,  # type: ignore[arg-type]
        )
    error = refused.value
    assert (error.status_code, error.type, error.param, error.code) == (
        400,
        "invalid_request_error",
        param,
        None,
    )
    assert error.message.endswith(f" - {param}: String should have at least 1 character")
    assert await _queued(aredis, "minilm") == 0


async def _first_content_refused(
    sdk: openai.AsyncOpenAI, aredis: aioredis.Redis, first: dict[str, Any]
) -> openai.BadRequestError:
    """OpenAI's 400 for a chat whose `first` message's content is refused, naming it, with
    nothing queued."""
    messages = [first, {"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.chat.completions.create(model="smollm2", messages=messages)  # type: ignore[arg-type]
    error = refused.value
    assert (error.status_code, error.type, error.param) == (
        400,
        "invalid_request_error",
        "messages.0.content",
    )
    assert await _queued(aredis, "smollm2") == 0
    return error


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant"])
async def test_a_message_of_no_parts_is_refused_naming_it(
    sdk: openai.AsyncOpenAI, aredis: aioredis.Redis, role: str
) -> None:
    error = await _first_content_refused(sdk, aredis, {"role": role, "content": []})
    assert "at least 1 item" in error.message


@pytest.mark.parametrize("role", ["system", "developer", "user"])
async def test_a_null_content_is_an_assistants_only(
    sdk: openai.AsyncOpenAI, aredis: aioredis.Redis, role: str
) -> None:
    """OpenAI's API takes a null `content` for an assistant's turn only (a refusal's or a tool
    call's): a user's null was read as an empty message."""
    error = await _first_content_refused(sdk, aredis, {"role": role, "content": None})
    assert error.message.endswith(
        " - messages.0.content: null is taken for an assistant's turn only: send a string or a"
        " list of parts"
    )

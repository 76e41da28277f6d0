"""A chat's history as OpenAI's API takes it: an assistant's content may hold refusal parts
(`{"type": "refusal", "refusal": ...}`), which vLLM's server reads as that text, or be null (a
refusal's or a tool call's turn, its text elsewhere), read as empty. They were refused (400).
OpenAI's SDK speaks to a producer served in-process over a real Valkey; the job's answer is
written into its token stream as a worker writes it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aioredis
from openai.types.chat import ChatCompletion

from producer_api.app import create_app
from shared.codec import loads
from shared.job_states import JobStatus
from shared.keys import Keys
from shared.settings import Settings
from shared.token_stream import TokenEvent, usage_of
from tests.app_client import app_client, openai_sdk
from workers.partition.token_writer import TokenAppend, TokenWriter

LANE = Keys().queue("smollm2", "default")


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="openai-r22-parts")
    async with app_client(create_app(settings)) as client:
        yield client


async def _enqueued(
    asked: asyncio.Future[Any], aredis: aioredis.Redis, after: bytes
) -> dict[bytes, bytes]:
    """The fields of the job `asked` enqueued on the lane after entry `after`; the request's
    own error if it ended first (refused)."""
    while not (entries := await aredis.xrange(LANE, min=b"(" + after, count=1)):
        if asked.done():
            asked.result()
        await asyncio.sleep(0.01)
    fields: dict[bytes, bytes] = entries[0][1]
    return fields


async def _answer(aredis: aioredis.Redis, job_id: str, text: str) -> None:
    """The job's whole answer, its final in its token stream before its record ends: a record
    ended first, with no outputs, is answered from the record (no usage)."""
    final = TokenEvent("final", status="succeeded", finish_reason="stop", usage=usage_of(3, 1))
    events = [TokenEvent("token", text=text, tokens=1), final]
    await TokenWriter(aredis, Keys(), 60).write([TokenAppend(job_id, "a", 1, events, True)], [])
    await aredis.hset(Keys().job(job_id), "status", JobStatus.SUCCEEDED.value)


async def _asked_and_answered(
    producer: httpx.AsyncClient, aredis: aioredis.Redis, turn: dict[str, Any]
) -> tuple[dict[bytes, bytes], ChatCompletion]:
    """A chat whose history holds the assistant's `turn`, asked with OpenAI's SDK: its job's
    fields on the lane, and the SDK's completion once the job is answered."""
    messages: Any = [
        {"role": "user", "content": "Pick a lock."},
        turn,
        {"role": "user", "content": "Then say hi."},
    ]
    newest = await aredis.xrevrange(LANE, count=1)
    after = newest[0][0] if newest else b"0-0"
    sdk = openai_sdk(producer)
    asked = asyncio.ensure_future(sdk.chat.completions.create(model="smollm2", messages=messages))
    try:
        with anyio.fail_after(5):  # a hang guard only
            fields = await _enqueued(asked, aredis, after)
            await _answer(aredis, fields[b"id"].decode(), "hi")
            return fields, await asked
    finally:
        asked.cancel()
        if left := [entry for entry, _ in await aredis.xrange(LANE, min=b"(" + after)]:
            await aredis.xdel(LANE, *left)


async def test_an_assistants_refusal_part_is_read_as_its_text(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """The history goes to the model as vLLM's server renders it: the refusal's text."""
    refused = {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]}
    fields, completion = await _asked_and_answered(producer, aredis, refused)
    sent = loads(fields[b"payload"])["inputs"]["messages"]
    assert sent[1] == {"role": "assistant", "content": "I can't."}, sent
    assert completion.choices[0].message.content == "hi"


async def test_an_assistants_null_content_is_read_as_empty(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """OpenAI answers a refusal with `content: null` (its text in `refusal`); a client replaying
    that history sent it back and got a 400 (`messages.1.content`), where vLLM's server reads
    the turn as empty."""
    replayed = {"role": "assistant", "content": None, "refusal": "I can't."}
    fields, completion = await _asked_and_answered(producer, aredis, replayed)
    sent = loads(fields[b"payload"])["inputs"]["messages"]
    assert sent[1] == {"role": "assistant", "content": ""}, sent
    assert completion.choices[0].message.content == "hi"

"""An OpenAI stream that ends in an error once its status was sent: the error chunk has the
four fields of OpenAI's error object (`message`, `type`, `param`, `code`), as vLLM's server
sends them mid-stream; Conveyor's own errors had only `type` and `message`, so a client that
reads `error["code"]` (as it does on OpenAI's and vLLM's) failed on a KeyError. A stream whose
token stream Redis refuses to read told its client to "reconnect to retry": an OpenAI route
takes no resume, so retrying posted the request again, a second job, while the first ran on.
An in-process producer on a real Valkey, no worker (tests/test_openai_stream_cut.py)."""

from __future__ import annotations

import json

import anyio
import redis.asyncio as aioredis

from producer_api.openai.protocol import ChatCompletionRequest, ChatMessage
from producer_api.openai.serving import DONE, ChatRenderer, OpenAIService
from shared.job_states import JobStatus
from shared.keys import Keys
from tests.test_openai_stream_cut import openai_service

OPENAI_ERROR = {"message", "type", "param", "code"}


async def _stream(
    service: OpenAIService, aredis: aioredis.Redis, stray: bool = False
) -> tuple[str, list[str]]:
    """A queued job's id and its chat stream's chunks: the producer asked to stop once the
    stream began; with `stray`, its token stream's key overwritten by a stray write before it
    opened instead."""
    message = ChatMessage(role="user", content="hi")
    request = ChatCompletionRequest(model="smollm2", messages=[message], stream=True)
    job_id = await service.submit(request)
    if stray:
        await aredis.set(Keys().tokens(job_id), "not a stream")
    renderer = ChatRenderer(job_id, "smollm2")
    opened = await service.open_stream(job_id, renderer, wait_s=0.05)  # still queued: opens
    shutdown, chunks = anyio.Event(), []
    with anyio.fail_after(20):  # a hang guard only
        async for chunk in service.stream(job_id, opened, renderer, shutdown):
            chunks.append(chunk)
            if not stray:
                shutdown.set()
    return job_id, chunks


async def test_an_error_chunk_has_the_fields_of_openais_error_object(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    async with openai_service(redis_url, aredis) as service:
        job_id, chunks = await _stream(service, aredis)
        await service.cancel(job_id)
    assert chunks[-1] == DONE, chunks
    error = json.loads(chunks[-2])["error"]
    assert set(error) == OPENAI_ERROR, error
    assert (error["type"], error["param"], error["code"]) == ("unavailable", None, None), error


async def test_a_refused_read_does_not_ask_an_openai_client_to_post_again(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    async with openai_service(redis_url, aredis) as service:
        job_id, chunks = await _stream(service, aredis, stray=True)
        status = await aredis.hget(Keys().job(job_id), "status")
        await service.cancel(job_id)
    assert chunks[-1] == DONE, chunks
    error = json.loads(chunks[-2])["error"]
    assert "WRONGTYPE" in error["message"], error
    assert "reconnect" not in error["message"] and "retry" not in error["message"], error
    assert f"GET /v1/jobs/{job_id}" in error["message"], error
    assert status == JobStatus.QUEUED.value.encode(), status  # it runs on, as the chunk says

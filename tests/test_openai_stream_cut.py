"""An OpenAI stream cut short by the producer's stop, on a real Valkey with the producer's
state in-process (no worker: the job stays queued). Its error chunk told the client to
"reconnect (with Last-Event-ID to resume)", the job-events route's advice: an OpenAI route
takes no Last-Event-ID, so reconnecting as told posted the request again, a second job, while
the first ran on. The chunk names where the job that runs on is answered instead."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.auth.principal import ANONYMOUS
from producer_api.openai.protocol import ChatCompletionRequest, ChatMessage
from producer_api.openai.serving import DONE, ChatRenderer, OpenAIService
from shared.keys import Keys
from shared.settings import Settings

LANE = Keys().queue("smollm2", "default")


@asynccontextmanager
async def openai_service(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[OpenAIService]:
    """The OpenAI service of an in-process producer on real Valkey. No worker serves it: the
    smollm2 jobs a test enqueues are taken out of its lane on the way out (the lane as found),
    those its cancel did not withdraw already."""
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="openai-unit"))
    newest = await aredis.xrevrange(LANE, count=1)
    after = newest[0][0] if newest else b"0-0"
    async with app.router.lifespan_context(app):
        yield OpenAIService(app.state.conveyor, ANONYMOUS)
    if left := [entry_id for entry_id, _ in await aredis.xrange(LANE, min=b"(" + after)]:
        await aredis.xdel(LANE, *left)


async def test_a_cut_stream_names_its_job_and_no_resume_it_does_not_take(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    async with openai_service(redis_url, aredis) as service:
        message = ChatMessage(role="user", content="hi")
        request = ChatCompletionRequest(model="smollm2", messages=[message], stream=True)
        job_id = await service.submit(request)
        renderer = ChatRenderer(job_id, "smollm2")
        opened = await service.open_stream(job_id, renderer, wait_s=0.2)  # still queued: opens
        shutdown, chunks = anyio.Event(), []
        with anyio.fail_after(30):  # a hang guard only
            async for chunk in service.stream(job_id, opened, renderer, shutdown):
                chunks.append(chunk)
                shutdown.set()  # the producer is asked to stop once the stream has begun
        await service.cancel(job_id)
    assert chunks[-1] == DONE, chunks
    error = json.loads(chunks[-2])["error"]
    assert error["type"] == "unavailable", error
    assert "Last-Event-ID" not in error["message"], error
    assert f"GET /v1/jobs/{job_id}" in error["message"], error

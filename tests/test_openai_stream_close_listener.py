"""An OpenAI request's token follower leaves the token hub as soon as the request is done with
it, on a real Valkey with the producer's state in-process (no worker: the test writes the token
stream as the worker's writer does). A stream left at a `restarted` chunk (`break` out of its
events), a whole answer's read returned from inside its events, and a stream closed by its client
before its first event (sse-starlette closes the body iterator when a send fails) left the
generators under them unclosed, the follower too: its listener stayed in the hub, which read
the job's stream on and queued every step of it for no one, until asyncio's finalizer or the
garbage collector came, or, its first read under way, for as long as the job sent nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import pytest
import redis.asyncio as aioredis

from producer_api.openai.protocol import ChatCompletionRequest, ChatMessage
from producer_api.openai.serving import DONE, ChatRenderer, OpenAIService
from producer_api.token_hub import TagReader
from shared.job_states import JobStatus
from shared.keys import Keys, job_tag
from shared.token_stream import TokenEvent, usage_of
from tests.test_openai_stream_cut import openai_service
from workers.partition.token_writer import TokenAppend, TokenWriter

KEYS = Keys()
HELLO = TokenEvent("token", text="Hel", tokens=1)


@dataclass
class Running:
    """A streamed chat request's job, marked running, whose token stream the test writes."""

    service: OpenAIService
    aredis: aioredis.Redis
    job_id: str
    renderer: ChatRenderer

    async def write(self, attempt: str, first: int, *events: TokenEvent) -> None:
        appended = TokenAppend(self.job_id, attempt, first, events, expire=True)
        await TokenWriter(self.aredis, KEYS, 60).write([appended], [])

    def listens(self) -> bool:
        """Whether the token hub holds a listener of the job's token stream."""
        reader: TagReader = self.service.state.tokens._readers[job_tag(self.job_id)]
        key = KEYS.tokens(self.job_id)
        return key in reader._queues or key in reader._cursors


@pytest.fixture
async def running(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[Running]:
    async with openai_service(redis_url, aredis) as service:
        message = ChatMessage(role="user", content="hi")
        request = ChatCompletionRequest(model="smollm2", messages=[message], stream=True)
        job_id = await service.submit(request)
        await aredis.hset(KEYS.job(job_id), "status", JobStatus.RUNNING.value)
        renderer = ChatRenderer(job_id, "smollm2")
        yield Running(service, aredis, job_id, renderer)


async def test_a_stream_left_at_a_restart_leaves_the_hub_before_its_last_chunk(
    running: Running,
) -> None:
    await running.write("run-a", 1, HELLO)
    opened = await running.service.open_stream(running.job_id, running.renderer)
    body = running.service.stream(running.job_id, opened, running.renderer, anyio.Event())
    assert '"role":"assistant"' in await anext(body)
    assert '"Hel"' in await anext(body)
    assert running.listens()
    await running.write("run-b", 1, TokenEvent("restart"))  # another worker runs it again
    assert '"type":"restarted"' in await anext(body)
    assert await anext(body) == DONE
    assert not running.listens()
    assert [chunk async for chunk in body] == []


async def test_a_stream_closed_before_its_first_event_leaves_the_hub(running: Running) -> None:
    opened = await running.service.open_stream(running.job_id, running.renderer, wait_s=0.05)
    assert not opened.first.done()  # its first read waits on in the hub
    body = running.service.stream(running.job_id, opened, running.renderer, anyio.Event())
    assert '"role":"assistant"' in await anext(body)
    await body.aclose()  # as sse-starlette closes it when a send fails: at a yield
    assert not running.listens()


async def test_a_whole_answer_leaves_the_hub_as_it_is_read(running: Running) -> None:
    final = TokenEvent("final", status="succeeded", finish_reason="stop")
    final.usage = usage_of(1, 1)
    await running.write("run-a", 1, HELLO, final)
    await running.aredis.hset(KEYS.job(running.job_id), "status", JobStatus.SUCCEEDED.value)
    generation = await running.service.complete(running.job_id, running.renderer)
    assert generation.text == "Hel"
    assert not running.listens()


async def test_a_stream_cancelled_while_it_waits_still_cancels_its_job(running: Running) -> None:
    """As sse-starlette ends a stream whose client went away: its task group cancelled while
    the stream waits for the job's next event. The cancel cuts the stop of the reads under it
    short (a read of the token follower runs on, to be closed by its reader): closing the
    follower there raised, "already running", and the job was not cancelled."""
    await running.write("run-a", 1, HELLO)
    opened = await running.service.open_stream(running.job_id, running.renderer)
    body = running.service.stream(running.job_id, opened, running.renderer, anyio.Event())
    sent: list[str] = []
    async with anyio.create_task_group() as streaming:

        async def respond() -> None:
            async for chunk in body:
                sent.append(chunk)
                if len(sent) == 2:  # the opening chunk and the token's: it waits on now
                    streaming.cancel_scope.cancel()

        streaming.start_soon(respond)
    status = await running.aredis.hget(KEYS.job(running.job_id), "status")
    assert (len(sent), status) == (2, JobStatus.CANCELLED.value.encode())

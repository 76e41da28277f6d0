"""Several readers of one LLM job's events, on a real Valkey with the producer in-process (no
worker: the test writes the token stream as the worker's writer does): each gets every token
in order and one final, and one whose client goes away mid-stream (its task cancelled, as
sse-starlette cancels it) leaves no task behind and its listener leaves the token hub, while
the others read on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.auth.principal import ANONYMOUS
from producer_api.events.api_router import server_sent
from producer_api.events.serving import EventsService
from producer_api.state import ProducerState
from shared.job_states import JobStatus
from shared.keys import Keys, job_tag
from shared.settings import Settings
from shared.token_stream import TokenEvent
from tests.app_client import app_client
from workers.partition.token_writer import TokenAppend, TokenWriter

READERS = 4
STEPS = 6


@pytest.fixture
async def running(
    redis_url: str, aredis: aioredis.Redis
) -> AsyncIterator[tuple[ProducerState, str]]:
    """The producer's state, and a generate job its worker runs (no worker: marked so)."""
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="sse-r8-many"))
    async with app_client(app) as client:
        body = {"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 8}}
        job_id = (await client.post("/v1/jobs", json=body)).json()["id"]
        await aredis.hset(Keys().job(job_id), "status", JobStatus.RUNNING.value)
        yield app.state.conveyor, job_id


async def _read(state: ProducerState, job_id: str, got: list[tuple[str, str]]) -> None:
    opened = await EventsService(state, ANONYMOUS).open(job_id, None)
    assert opened is not None
    async for event in server_sent(opened, anyio.Event()):
        got.append((event.event, json.loads(event.data).get("text", "")))


async def test_every_reader_gets_every_token_and_one_that_leaves_leaves_nothing(
    running: tuple[ProducerState, str], aredis: aioredis.Redis
) -> None:
    state, job_id = running
    before = asyncio.all_tasks()
    got: list[list[tuple[str, str]]] = [[] for _ in range(READERS)]
    readers = [asyncio.create_task(_read(state, job_id, events)) for events in got]
    writer = TokenWriter(aredis, Keys(), 60)
    for step in range(STEPS):
        token = TokenEvent("token", text=str(step), tokens=1)
        await writer.write([TokenAppend(job_id, "run-a", step + 1, [token], step == 0)], [])
        await asyncio.sleep(0.01)
        if step == STEPS // 2:
            readers[0].cancel()  # its client went away
    final = TokenEvent("final", status="succeeded", finish_reason="stop")
    await writer.write([TokenAppend(job_id, "run-a", STEPS + 1, [final], True)], [])
    await aredis.hset(Keys().job(job_id), "status", JobStatus.SUCCEEDED.value)
    await asyncio.wait(readers, timeout=5)

    whole = [("token", str(step)) for step in range(STEPS)] + [("final", "")]
    assert all(events == whole for events in got[1:]), got
    assert readers[0].cancelled() and got[0] == whole[: len(got[0])], got[0]
    await asyncio.sleep(0)  # the cancelled reader's last callbacks
    assert not asyncio.all_tasks() - before, asyncio.all_tasks() - before
    assert not state.tokens._readers[job_tag(job_id)]._queues

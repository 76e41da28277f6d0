"""A job-events stream closed between two events (sse-starlette closes it so when a send fails:
the client went away, or stopped reading past the send timeout), on a real Valkey with the
producer in-process (no worker: the test writes the token stream as the worker's writer does).
Closing it left the generators inside it unclosed, the token follower too, waiting for the
garbage collector (a reference cycle kept them): its listener stayed in the token hub, which
read the job's stream on and queued every step of it for no one. It leaves the hub as the
stream closes."""

from __future__ import annotations

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


@pytest.fixture
async def running(
    redis_url: str, aredis: aioredis.Redis
) -> AsyncIterator[tuple[ProducerState, str]]:
    """The producer's state, and a generate job its worker runs (no worker: marked so)."""
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="sse-closed"))
    async with app_client(app) as client:
        body = {"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 4}}
        job_id = (await client.post("/v1/jobs", json=body)).json()["id"]
        await aredis.hset(Keys().job(job_id), "status", JobStatus.RUNNING.value)
        yield app.state.conveyor, job_id


@pytest.mark.parametrize("read", [1, 2], ids=["after-its-first-event", "after-a-live-one"])
async def test_a_stream_closed_between_events_leaves_the_token_hub(
    running: tuple[ProducerState, str], aredis: aioredis.Redis, read: int
) -> None:
    state, job_id = running
    writer = TokenWriter(aredis, Keys(), 60)
    tokens = [TokenEvent("token", text=text, tokens=1) for text in ("Hel", "lo")]
    await writer.write([TokenAppend(job_id, "run-a", 1, tokens[:1], expire=True)], [])

    opened = await EventsService(state, ANONYMOUS).open(job_id, None)
    assert opened is not None
    body = server_sent(opened, anyio.Event())  # the route's body iterator
    assert '"Hel"' in (await anext(body)).data
    if read == 2:
        await writer.write([TokenAppend(job_id, "run-a", 2, tokens[1:], expire=False)], [])
        assert '"lo"' in (await anext(body)).data
    reader = state.tokens._readers[job_tag(job_id)]
    assert Keys().tokens(job_id) in reader._queues
    await body.aclose()  # as sse-starlette closes it when a send fails: at a yield
    assert Keys().tokens(job_id) not in reader._queues
    assert Keys().tokens(job_id) not in reader._cursors

"""A generate job's event stream whose job hash goes (its TTL lapsed: a job queued past its
deadline with no worker to expire it, or deleted) while a reader waits, on a real Valkey with
the producer in-process (no worker: the test writes the token stream as the worker's writer
does). The stream ended with neither a `final` nor an `error` event, as a cut connection does:
its client reconnected only to be told 404. It ends with an `error` event saying the job is not
found, as the stream of any other job and OpenAI's routes end then."""

from __future__ import annotations

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


@pytest.fixture
async def running(
    redis_url: str, aredis: aioredis.Redis
) -> AsyncIterator[tuple[ProducerState, str]]:
    """The producer's state, and a generate job its worker runs (no worker: marked so)."""
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="sse-r8-gone"))
    async with app_client(app) as client:
        body = {"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 4}}
        job_id = (await client.post("/v1/jobs", json=body)).json()["id"]
        await aredis.hset(Keys().job(job_id), "status", JobStatus.RUNNING.value)
        yield app.state.conveyor, job_id


async def test_a_stream_whose_job_is_gone_ends_with_a_not_found_error_event(
    running: tuple[ProducerState, str], aredis: aioredis.Redis
) -> None:
    state, job_id = running
    token = TokenEvent("token", text="Hel", tokens=1)
    await TokenWriter(aredis, Keys(), 60).write(
        [TokenAppend(job_id, "run-a", 1, [token], True)], []
    )
    opened = await EventsService(state, ANONYMOUS).open(job_id, None)
    assert opened is not None
    body = server_sent(opened, anyio.Event())
    assert (await anext(body)).event == "token"

    await aredis.delete(Keys().job(job_id))  # the follower looks at it within a second
    rest = [event async for event in body]
    assert [event.event for event in rest] == ["error"], rest
    assert json.loads(rest[0].data)["type"] == "not_found" and job_id in rest[0].data
    assert Keys().tokens(job_id) not in state.tokens._readers[job_tag(job_id)]._queues

"""The job-events stream held to its documented data (producer_api/events/protocol.py): every
`scaling`, `queued`, `restart`, `token` and `final` event of real streams parses with its model,
and each model refuses the event's data with a field it does not name, so a field added or
renamed in the serving code without its model fails here. The models used to ignore unknown
fields and nothing parsed the stream with them: they could drift from it unseen. On a real
Valkey with the producer in-process and no worker: the token stream is written by the worker's
own `RunningJob` and `TokenWriter`, as its generate loop writes it."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator

import anyio
import httpx
import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel, ValidationError
from sse_starlette import ServerSentEvent

from producer_api.app import create_app
from producer_api.auth.principal import ANONYMOUS
from producer_api.events.api_router import server_sent
from producer_api.events.protocol import (
    FinalData,
    QueuedData,
    RestartData,
    ScalingData,
    TokenData,
)
from producer_api.events.serving import EventsService
from producer_api.state import ProducerState
from shared.job_states import JobStatus
from shared.keys import Keys
from shared.settings import Settings
from shared.token_stream import TokenEvent
from tests.app_client import app_client
from tests.conftest import until_async
from workers.engines.base import GenerateRequest, TokenChunk
from workers.generation.generate_job import RunningJob, engine_failure
from workers.partition.stream_reader import Delivery
from workers.partition.token_writer import TokenWriter

KEYS = Keys("r39contract:")  # no heartbeat of any test's worker: no worker serves smollm2
MODEL = "smollm2"
CONTRACT: dict[str, type[BaseModel]] = {
    "queued": QueuedData,
    "scaling": ScalingData,
    "restart": RestartData,
    "token": TokenData,
    "final": FinalData,
}
# A generation that ended by itself: text, then a last step with a token and no text.
CHUNKS = [
    TokenChunk("Yes", 1, None, prompt_tokens=5, completion_tokens=1),
    TokenChunk("", 1, "stop", prompt_tokens=5, completion_tokens=2),
]


@pytest.fixture
async def producer(redis_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, ProducerState]]:
    settings = Settings(
        redis_url=redis_url, auth="disabled", instance_id="r39-contract", key_prefix=KEYS.prefix
    )
    app = create_app(settings)
    async with app_client(app) as client:
        yield client, app.state.conveyor


async def _submit(client: httpx.AsyncClient) -> str:
    body = {"model": MODEL, "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 4}}
    response = await client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


async def _stream(state: ProducerState, job_id: str) -> AsyncGenerator[ServerSentEvent, None]:
    """The job's events from its start, as `GET /v1/jobs/{id}/events` sends them."""
    opened = await EventsService(state, ANONYMOUS).open(job_id, None)
    assert opened is not None
    return server_sent(opened, anyio.Event())


async def _load_known(state: ProducerState) -> bool:
    return state.queue_eta.load(MODEL, "default") is not None


def _run(job_id: str, redelivered: bool = False) -> RunningJob:
    delivery = Delivery(b"1-0", None, JobStatus.RUNNING.value, 0)
    return RunningJob(delivery, "lane", GenerateRequest(job_id), redelivered=redelivered)


async def _appended(aredis: aioredis.Redis, job: RunningJob, events: list[TokenEvent]) -> None:
    await TokenWriter(aredis, KEYS, 60).write([job.append(events)], [])


async def _ended(aredis: aioredis.Redis, job: RunningJob) -> None:
    """The job's end as its worker writes it: FINISH's status, then the final event."""
    await aredis.hset(KEYS.job(job.job_id), "status", job.status.value)
    await _appended(aredis, job, [job.final_event()])


def _held_to_contract(events: list[ServerSentEvent]) -> list[BaseModel]:
    """Each event's data parsed with its model, which refuses it with one more field."""
    parsed = []
    for event in events:
        model = CONTRACT[str(event.event)]
        parsed.append(model.model_validate_json(str(event.data)))
        with pytest.raises(ValidationError, match="extra_forbidden"):
            model.model_validate({**json.loads(str(event.data)), "renamed": 1})
    return parsed


async def test_a_generations_events_hold_to_their_models(
    producer: tuple[httpx.AsyncClient, ProducerState], aredis: aioredis.Redis
) -> None:
    """Queued with no worker (`scaling`, `queued`), then a redelivered run (`restart`), its
    tokens and its final."""
    client, state = producer
    job_id = await _submit(client)
    await until_async(lambda: _load_known(state))  # else the first look sends no `scaling`
    stream = await _stream(state, job_id)
    with anyio.fail_after(30):  # a hang guard only
        events = [await anext(stream) for _ in range(2)]
        job = _run(job_id, redelivered=True)
        await aredis.hset(KEYS.job(job_id), "status", JobStatus.RUNNING.value)
        await _appended(aredis, job, [event for chunk in CHUNKS for event in job.take(chunk, 1, 1)])
        await _ended(aredis, job)
        events += [event async for event in stream]

    names = [event.event for event in events]
    assert names == ["scaling", "queued", "restart", "token", "token", "final"], events
    *_, final = _held_to_contract(events)
    assert isinstance(final, FinalData) and final.usage is not None, final
    assert (final.status, final.usage.completion_tokens) == ("succeeded", 2), final


async def test_finals_made_from_the_job_and_a_failed_runs_hold_to_their_model(
    producer: tuple[httpx.AsyncClient, ProducerState], aredis: aioredis.Redis
) -> None:
    """A job cancelled while queued (its final made from the job: no usage) and one whose run
    failed (its worker's final, with the job's error)."""
    client, state = producer
    cancelled, failed = await _submit(client), await _submit(client)
    assert (await client.delete(f"/v1/jobs/{cancelled}")).status_code == 200
    job = _run(failed)
    job.error = engine_failure(RuntimeError("the engine died"))
    await _ended(aredis, job)

    with anyio.fail_after(30):  # a hang guard only
        events = [
            event for job_id in (cancelled, failed) async for event in await _stream(state, job_id)
        ]

    assert [event.event for event in events] == ["final", "final"], events
    made, run = _held_to_contract(events)
    assert isinstance(made, FinalData) and made.status == "cancelled", made
    assert "usage" not in json.loads(str(events[0].data)), events[0]  # it ran no step
    assert isinstance(run, FinalData) and run.status == "failed", run
    assert run.error == {"type": "RuntimeError", "message": "the engine died"}, run

"""A finished LLM job's token stream that expires (CONVEYOR_TOKEN_STREAM_TTL_S) while a slow
reader is part-way through it, on a real Valkey with the producer in-process (no worker: the
test writes the stream as the worker's writer does, and deletes it as its TTL would: a reader
cannot tell the two apart). The reader's next page found nothing, and its stream ended with a
`final` made from the job's record: the text it held was silently cut short. Now the job's
events retell the record's whole text (`restart`, to drop the partial text, then one `token`)
before that final; an OpenAI stream, which cannot take back text sent, ends with a
`stream_expired` error chunk instead of a closing chunk that passed the cut text as whole."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aioredis
from sse_starlette import ServerSentEvent

from producer_api.app import create_app
from producer_api.auth.principal import ANONYMOUS
from producer_api.events.api_router import server_sent
from producer_api.events.serving import EventsService
from producer_api.openai.serving import DONE, ChatRenderer, OpenAIService
from producer_api.state import ProducerState
from shared.codec import as_text, dumps
from shared.keys import Keys, new_job_id
from shared.settings import Settings
from shared.token_stream import READ_COUNT, TokenEvent, usage_of
from tests.app_client import app_client
from tests.test_llm_pipeline import sse_events
from workers.partition.token_writer import TokenAppend, TokenWriter

KEYS = Keys()
STEPS = 2 * READ_COUNT  # two pages: the stream expires once the first is read
WHOLE = "".join(f"{n} " for n in range(STEPS))
USAGE = usage_of(3, STEPS)


@dataclass
class Producer:
    client: httpx.AsyncClient
    state: ProducerState


@pytest.fixture
async def producer(redis_url: str) -> AsyncIterator[Producer]:
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="sse-r28-ttl"))
    async with app_client(app) as client:
        yield Producer(client, app.state.conveyor)


async def _finished_job(aredis: aioredis.Redis) -> tuple[str, list[str]]:
    """A smollm2 job that succeeded with STEPS tokens, its stream whole (its worker's final
    last); returns its id and its entries' ids."""
    job_id = new_job_id("smollm2", "default")
    tokens = [TokenEvent("token", text=f"{n} ", tokens=1) for n in range(STEPS)]
    final = TokenEvent("final", status="succeeded", finish_reason="length", usage=USAGE)
    outputs = {"text": WHOLE, "finish_reason": "length", "usage": USAGE}
    fields: dict[Any, Any] = {"status": "succeeded", "model": "smollm2", "outputs": dumps(outputs)}
    await aredis.hset(KEYS.job(job_id), mapping=fields)
    await aredis.expire(KEYS.job(job_id), 60)
    appended = TokenAppend(job_id, "run-a", 1, [*tokens, final], expire=True)
    await TokenWriter(aredis, KEYS, 60).write([appended], [])
    rows: Any = await aredis.xrange(KEYS.tokens(job_id))
    return job_id, [as_text(entry_id) for entry_id, _ in rows]


def _as_read(event: ServerSentEvent) -> dict[str, str]:
    """A sent event's fields as its client reads them (`sse_events`)."""
    fields = {"event": str(event.event), "data": str(event.data)}
    return fields | ({"id": str(event.id)} if event.id else {})


def _retold(events: list[dict[str, str]]) -> None:
    """`events` end with the record's whole text retold, then its final (id 0-1: the stream
    holds none)."""
    restart, whole, final = events[-3:]
    assert [e["event"] for e in (restart, whole, final)] == ["restart", "token", "final"]
    assert "id" not in restart and "id" not in whole  # a resume after them hears it all again
    assert json.loads(whole["data"]) == {"text": WHOLE, "tokens": STEPS}
    assert final["id"] == "0-1"
    assert json.loads(final["data"])["status"] == "succeeded"


async def test_a_stream_expired_between_pages_retells_the_whole_text(
    producer: Producer, aredis: aioredis.Redis
) -> None:
    job_id, ids = await _finished_job(aredis)
    opened = await EventsService(producer.state, ANONYMOUS).open(job_id, None)
    assert opened is not None
    body = server_sent(opened, anyio.Event())
    assert (await anext(body)).id == ids[0]  # its first page is read; the client reads on, slowly

    await aredis.delete(KEYS.tokens(job_id))  # the stream expires
    rest = [_as_read(event) async for event in body]
    _retold(rest)
    assert [e.get("id") for e in rest[:-3]] == ids[1:READ_COUNT]


async def test_a_resume_after_the_stream_expired_retells_the_whole_text_then_204(
    producer: Producer, aredis: aioredis.Redis
) -> None:
    job_id, ids = await _finished_job(aredis)
    await aredis.delete(KEYS.tokens(job_id))
    url = f"/v1/jobs/{job_id}/events"

    response = await producer.client.get(url, headers={"Last-Event-ID": ids[5]})
    assert response.status_code == 200
    events = list(sse_events(response.text.splitlines()))
    assert len(events) == 3, events
    _retold(events)
    after = await producer.client.get(url, headers={"Last-Event-ID": events[-1]["id"]})
    assert after.status_code == 204  # nothing follows: an EventSource stops


async def test_an_openai_stream_expired_mid_read_ends_with_an_error_not_a_cut_answer(
    producer: Producer, aredis: aioredis.Redis
) -> None:
    job_id, _ = await _finished_job(aredis)
    service, renderer = OpenAIService(producer.state, ANONYMOUS), ChatRenderer(job_id, "smollm2")
    opened = await service.open_stream(job_id, renderer)
    body = service.stream(job_id, opened, renderer, anyio.Event())
    assert '"role":"assistant"' in await anext(body)
    assert '"0 "' in await anext(body)

    await aredis.delete(KEYS.tokens(job_id))
    rest = [chunk async for chunk in body]
    assert rest[-1] == DONE
    error = json.loads(rest[-2])["error"]
    assert error["type"] == "stream_expired" and f"GET /v1/jobs/{job_id}" in error["message"]
    assert not any('"finish_reason":"length"' in chunk for chunk in rest)
    assert (await producer.client.get(f"/v1/jobs/{job_id}")).json()["status"] == "succeeded"

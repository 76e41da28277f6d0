"""`Last-Event-ID` of a `final` made from the job, once its worker's own final landed after it,
on a real Valkey with the producer in-process (no worker: the test writes the token stream as
the worker's writer does). A job cancelled while it ran, its worker still at the step in hand,
ends an open stream with a final made from its hash (id: the one after the stream's last
entry); the worker then appends its own `cancelled` final. An EventSource reconnects after
every stream's end with the made final's id: it was refused (422, the EventSource's `error`),
though nothing follows it, as after any final (204, the spec's "stop")."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from shared.token_stream import TokenEvent, made_final_id
from tests.app_client import app_client
from tests.test_llm_pipeline import sse_events
from workers.partition.token_writer import TokenAppend, TokenWriter

RUN = "run-a"


@pytest.fixture
async def client(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="sse-made-final")
    async with app_client(create_app(settings)) as client:
        yield client


async def _events(
    client: httpx.AsyncClient, job_id: str, after: str | None = None
) -> tuple[int, list[dict[str, str]]]:
    headers = {"Last-Event-ID": after} if after else {}
    response = await client.get(f"/v1/jobs/{job_id}/events", headers=headers)
    return response.status_code, list(sse_events(response.text.splitlines()))


async def test_a_resume_after_a_made_final_the_workers_final_followed_is_told_204(
    client: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    body = {"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 4}}
    job_id = (await client.post("/v1/jobs", json=body)).json()["id"]
    writer = TokenWriter(aredis, Keys(), 60)
    token = TokenEvent("token", text="Hel", tokens=1)
    await writer.write([TokenAppend(job_id, RUN, 1, [token], expire=True)], [])
    assert (await client.delete(f"/v1/jobs/{job_id}")).status_code == 200

    status, events = await _events(client, job_id)
    assert status == 200 and [e["event"] for e in events] == ["token", "final"], events
    made = events[-1]["id"]
    assert made == made_final_id(events[0]["id"]) and '"cancelled"' in events[-1]["data"]

    final = TokenEvent("final", status="cancelled", finish_reason="abort")
    await writer.write([TokenAppend(job_id, RUN, 2, [final], expire=True)], [])
    assert await _events(client, job_id, made) == (204, [])
    status, rest = await _events(client, job_id, events[0]["id"])  # the worker's final
    assert status == 200 and [e["event"] for e in rest] == ["final"], rest

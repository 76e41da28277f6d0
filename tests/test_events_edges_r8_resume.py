"""`Last-Event-ID` at every kind of id, on a real Valkey with the producer in-process (no
worker: the test writes the token stream as the worker's writer does and ends the job in its
hash). An LLM job's stream resumes right after the id named (none repeated, none skipped), and
says 204 after its final; an id it never sent is a 422 in the error shape. A job that streams
no tokens (its only id that of its final, `0-1`) took any other id once it had ended and sent
its final again, as if the id were its own: refused while it was queued, accepted after."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.job_states import JobStatus
from shared.keys import Keys
from shared.settings import Settings
from shared.token_stream import TokenEvent
from tests.app_client import app_client
from tests.test_llm_pipeline import sse_events
from workers.partition.token_writer import TokenAppend, TokenWriter

TEXTS = ("Hel", "lo", " there")


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="sse-r8-resume")
    async with app_client(create_app(settings)) as client:
        yield client


async def _events(
    client: httpx.AsyncClient, job_id: str, after: str | None = None
) -> tuple[int, list[dict[str, str]]]:
    headers = {"Last-Event-ID": after} if after is not None else {}
    response = await client.get(f"/v1/jobs/{job_id}/events", headers=headers)
    if response.status_code != 200:
        return response.status_code, [response.json()] if response.content else []
    return 200, list(sse_events(response.text.splitlines()))


async def _generated(client: httpx.AsyncClient, aredis: aioredis.Redis) -> str:
    """A generate job that streamed TEXTS and succeeded."""
    body = {"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 4}}
    job_id: str = (await client.post("/v1/jobs", json=body)).json()["id"]
    tokens = [TokenEvent("token", text=text, tokens=1) for text in TEXTS]
    final = TokenEvent("final", status="succeeded", finish_reason="stop")
    await TokenWriter(aredis, Keys(), 60).write(
        [TokenAppend(job_id, "run-a", 1, [*tokens, final], expire=True)], []
    )
    await aredis.hset(Keys().job(job_id), "status", JobStatus.SUCCEEDED.value)
    return job_id


async def test_a_resume_at_each_id_sends_what_follows_it_once(
    client: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    job_id = await _generated(client, aredis)
    await asyncio.sleep(0.002)  # the other job's ids in a later millisecond: none shared
    other = await _generated(client, aredis)
    status, events = await _events(client, job_id)
    assert status == 200 and [e["event"] for e in events] == ["token"] * 3 + ["final"], events
    ids = [e["id"] for e in events]
    for at in range(len(ids) - 1):  # the first token's, a middle one's, the last token's
        assert await _events(client, job_id, ids[at]) == (200, events[at + 1 :]), ids[at]
    assert await _events(client, job_id, ids[-1]) == (204, [])
    foreign = (await _events(client, other))[1][1]["id"]
    for refused in (foreign, "abc", "1-2-3", f"{2**64}-0"):
        status, errors = await _events(client, job_id, refused)
        assert status == 422 and errors[0]["error"]["type"] == "invalid_request", refused
        assert "Last-Event-ID" in errors[0]["error"]["message"], errors


async def test_an_ended_job_that_streams_no_tokens_refuses_an_id_it_never_sent(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": "identity", "inputs": {"x": 1}}
    job_id = (await client.post("/v1/jobs", json=body)).json()["id"]
    assert (await client.delete(f"/v1/jobs/{job_id}")).status_code == 200
    status, events = await _events(client, job_id)
    assert status == 200 and [(e["event"], e["id"]) for e in events] == [("final", "0-1")]
    assert (await _events(client, job_id, "0-1")) == (204, [])
    status, errors = await _events(client, job_id, "1796504080094-3")  # another job's
    assert status == 422 and "Last-Event-ID" in errors[0]["error"]["message"], errors

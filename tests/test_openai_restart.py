"""An OpenAI stream whose job is run again by another worker (its first died), on a real Valkey
with the producer in-process and the token stream written by the worker's own TokenWriter. The
second worker's first write is `restart` whether or not the first wrote anything: a stream that
had sent no text yet used to end there with a `restarted` error chunk and cancel the job, though
the job had just started cleanly and nothing was to be taken back."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.job_states import JobStatus
from shared.keys import Keys
from shared.settings import Settings
from shared.token_stream import TokenEvent, usage_of
from workers.partition.token_writer import TokenAppend, TokenWriter

KEYS = Keys()
LANE = KEYS.queue("smollm2", "default")


async def _next_job(client: aioredis.Redis, after: bytes) -> tuple[bytes, str]:
    """The entry and job id of the first job enqueued on the lane after entry `after`."""
    for _ in range(200):
        if rows := await client.xrange(LANE, min=b"(" + after, count=1):
            return rows[0][0], rows[0][1][b"id"].decode()
        await asyncio.sleep(0.05)
    raise AssertionError("the chat request enqueued no job")


def _contents(body: str) -> tuple[list[Any], list[str]]:
    datas = [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data:")]
    return [d for d in datas if d != "[DONE]"], datas


@pytest.mark.parametrize("text_first", [False, True])
async def test_a_restart_ends_the_stream_only_once_text_was_sent(
    redis_url: str, aredis: aioredis.Redis, text_first: bool
) -> None:
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="restart"))
    newest = await aredis.xrevrange(LANE, count=1)
    after = newest[0][0] if newest else b"0-0"
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            answer = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            entry_id, job_id = await _next_job(aredis, after)
            await asyncio.sleep(0.3)  # the stream follows the job's token stream by now
            final = TokenEvent("final", status="succeeded", finish_reason="stop")
            final.usage = usage_of(1, 1)
            events = [TokenEvent("restart"), TokenEvent("token", text="Hello", tokens=1), final]
            if text_first:  # the first worker's text, sent before it died
                events.insert(0, TokenEvent("token", text="Hel", tokens=1))
            appended = TokenAppend(job_id, "attempt-2", 1, events, expire=True)
            await TokenWriter(aredis, KEYS, 60).write([appended], [])
            await aredis.hset(KEYS.job(job_id), "status", JobStatus.SUCCEEDED.value)
            response = await asyncio.wait_for(answer, 30)
    await aredis.xdel(LANE, entry_id)  # no worker here takes it: leave the lane as found
    assert response.status_code == 200, response.text
    chunks, datas = _contents(response.text)
    assert datas[-1] == "[DONE]"
    if text_first:  # what was sent cannot be taken back: the client is told to retry
        assert '"type":"restarted"' in datas[-2] and "Hello" not in response.text, datas
        return
    assert "restarted" not in response.text, response.text
    assert "Hello" in "".join(chunks) and '"finish_reason":"stop"' in "".join(chunks)
    assert (await aredis.hget(KEYS.job(job_id), "status")) == b"succeeded"  # not cancelled


async def test_a_token_write_resent_after_its_reply_was_lost_appends_nothing_twice(
    aredis: aioredis.Redis,
) -> None:
    """redis-py resends a pipeline whose connection dropped after the server ran it: plain
    XADDs appended the tick's text again, and every reader showed it twice."""
    job_id, writer = "resent-1", TokenWriter(aredis, KEYS, 60)
    tick = [TokenEvent("token", text="Hel", tokens=1), TokenEvent("token", text="lo", tokens=1)]
    first = TokenAppend(job_id, "run-a", 1, tick, expire=True)
    await writer.write([first], [])
    await writer.write([first], [])  # the same call again: its reply was lost
    final = TokenEvent("final", status="succeeded", finish_reason="stop")
    await writer.write([TokenAppend(job_id, "run-a", 3, [tick[1], final], expire=True)], [])
    rerun = TokenAppend(job_id, "run-b", 1, [TokenEvent("restart")], expire=False)
    await writer.write([rerun], [])  # another run of the job appends from its own first event
    stream = KEYS.tokens(job_id)
    texts = [fields.get(b"text", fields[b"kind"]) for _, fields in await aredis.xrange(stream)]
    assert texts == [b"Hel", b"lo", b"lo", b"final", b"restart"]
    assert 0 < await aredis.ttl(stream) <= 60


async def test_a_run_another_run_of_its_job_overtook_appends_nothing_more(
    aredis: aioredis.Redis,
) -> None:
    """A worker cut off past the visibility timeout generates on while another runs the job
    again: its later events were appended after the new run's `restart`, so the two runs'
    text interleaved and its `final` could end a reader's stream early. They are refused."""
    job_id, writer = "overtaken-1", TokenWriter(aredis, KEYS, 60)
    old, new = TokenEvent("token", text="A1", tokens=1), TokenEvent("token", text="B1", tokens=1)
    await writer.write([TokenAppend(job_id, "run-a", 1, [old], expire=True)], [])
    rerun = TokenAppend(job_id, "run-b", 1, [TokenEvent("restart"), new], expire=True)
    assert (await writer.write([rerun], [])).refused == []
    late = [TokenEvent("token", text="A2", tokens=1)]
    written = await writer.write([TokenAppend(job_id, "run-a", 2, late, expire=False)], [job_id])
    assert written.refused == [job_id]
    assert written.statuses == {job_id: None}  # no job hash here
    rows = await aredis.xrange(KEYS.tokens(job_id))
    assert [fields.get(b"text", fields[b"kind"]) for _, fields in rows] == [
        b"A1",
        b"restart",
        b"B1",
    ]

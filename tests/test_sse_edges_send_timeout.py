"""A job-events stream whose client stopped reading, on a real Valkey with the producer
in-process (no worker: the test writes the token stream as the worker's writer does). Its
server's send then waits for the client's window to open (uvicorn's `drain`), and the route set
no send timeout: the send waited for ever, holding the stream's task and its place in the token
hub until the client closed the socket. A send that makes no progress
for SEND_TIMEOUT_S now ends the stream; the client resumes with Last-Event-ID."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from starlette.types import Message

from producer_api import stream_shutdown
from producer_api.app import create_app
from producer_api.state import ProducerState
from shared.job_states import JobStatus
from shared.keys import Keys, job_tag
from shared.settings import Settings
from shared.token_stream import TokenEvent
from tests.app_client import app_client
from workers.partition.token_writer import TokenAppend, TokenWriter

STALLED_S = 0.2  # the send timeout under test: as long as a send waits before the stream ends
GUARD_S = 5  # how long the test waits for the stream to end at all


@pytest.fixture
async def running(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Any, ProducerState, str]]:
    """The app, its state, and a generate job its (absent) worker runs, a token written."""
    monkeypatch.setattr(stream_shutdown, "SEND_TIMEOUT_S", STALLED_S)
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="sse-stalled"))
    async with app_client(app) as client:
        body = {"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 4}}
        job_id = (await client.post("/v1/jobs", json=body)).json()["id"]
        await aredis.hset(Keys().job(job_id), "status", JobStatus.RUNNING.value)
        token = TokenEvent("token", text="Hel", tokens=1)
        await TokenWriter(aredis, Keys(), 60).write(
            [TokenAppend(job_id, "a", 1, [token], True)], []
        )
        yield app, app.state.conveyor, job_id


async def test_a_send_the_client_never_takes_ends_the_stream(
    running: tuple[Any, ProducerState, str], caplog: pytest.LogCaptureFixture
) -> None:
    app, state, job_id = running
    sent: list[Message] = []

    requested = False

    async def receive() -> Message:
        nonlocal requested
        if not requested:  # the request's (empty) body, then nothing: the client stays
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()  # a full window: uvicorn's drain never returns

    path = f"/v1/jobs/{job_id}/events"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    ended = False
    with anyio.move_on_after(GUARD_S):
        await app(scope, receive, send)
        ended = True
    assert ended, "a send the client never took held the stream open"
    assert not [r.message for r in caplog.records if r.levelno >= logging.ERROR]  # no bug's log
    assert sent[0]["status"] == 200 and b'"Hel"' in sent[1]["body"]
    reader = state.tokens._readers[job_tag(job_id)]
    assert Keys().tokens(job_id) not in reader._queues  # its place in the hub is given back

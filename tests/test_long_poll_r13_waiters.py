"""What ends a long-poll, on a real Valkey with the producer served in-process (no worker: a job
stays queued until the test ends it): its job's end wakes every request waiting on it; a reply
about another job wakes none of them, nor answers for their job; `wait=0` reads the job at once;
a `wait` past `CONVEYOR_MAX_WAIT_S` is cut to it, and one past 600 s refused (422)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI

from producer_api.app import create_app
from producer_api.reply_listener import ReplyListener
from shared.codec import dumps
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async

PREFIX = "long-poll-r13-waiters:"
QUEUED = {"model": "identity", "inputs": {"x": 1}}  # no worker here: it stays queued
WAIT = {"wait": 3}  # never sat out unless a reply goes unheard
MAX_WAIT_S = 0.5


@pytest.fixture
async def app(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[FastAPI]:
    settings = Settings(
        redis_url=redis_url, key_prefix=PREFIX, auth="disabled", max_wait_s=MAX_WAIT_S
    )
    yield create_app(settings)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app_client(app) as served:
        yield served


async def _queued(client: httpx.AsyncClient) -> str:
    accepted = await client.post("/v1/jobs", json=QUEUED)
    assert accepted.status_code == 202, accepted.text
    return str(accepted.json()["id"])


async def _waiters(app: FastAPI, job_id: str, count: int) -> list[asyncio.Future[dict[str, Any]]]:
    """The reply waiters of `count` requests that long-poll `job_id`, once all registered."""
    replies: ReplyListener = app.state.conveyor.replies

    async def registered() -> bool:
        return len(replies._waiters.get(job_id, ())) == count

    await until_async(registered, timeout=5, every=0.01)
    return list(replies._waiters[job_id])


async def test_two_long_polls_of_one_job_are_both_woken_by_its_end(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    job_id = await _queued(client)
    url = f"/v1/jobs/{job_id}"
    polls = [asyncio.ensure_future(client.get(url, params=WAIT)) for _ in range(2)]
    waiters = await _waiters(app, job_id, 2)
    assert (await client.delete(url)).status_code == 200  # its cancel publishes its end
    answers = await asyncio.gather(*polls)
    assert [answer.json()["status"] for answer in answers] == ["cancelled"] * 2
    # each woken by the reply: a wait that ran out leaves its waiter pending
    assert [waiter.done() and waiter.result()["id"] for waiter in waiters] == [job_id] * 2


async def test_a_reply_about_another_job_neither_wakes_nor_answers_a_long_poll(
    app: FastAPI, client: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    job_id, other = await _queued(client), await _queued(client)
    url = f"/v1/jobs/{job_id}"
    poll = asyncio.ensure_future(client.get(url, params=WAIT))
    [waiter] = await _waiters(app, job_id, 1)
    replies: ReplyListener = app.state.conveyor.replies
    ended = {"id": other, "status": "succeeded", "model": "identity", "variant": "default"}
    # on the polled job's own channel, as a worker's micro-batch of several jobs would be
    await aredis.execute_command("SPUBLISH", replies.channel(job_id), dumps([ended]))
    assert (await client.delete(url)).status_code == 200
    answer = await poll
    assert (answer.json()["id"], answer.json()["status"]) == (job_id, "cancelled")
    assert waiter.result()["id"] == job_id  # woken by its own job's end, the first it heard


async def test_wait_zero_reads_the_job_at_once(app: FastAPI, client: httpx.AsyncClient) -> None:
    job_id = await _queued(client)
    read = await client.get(f"/v1/jobs/{job_id}", params={"wait": 0})
    assert (read.status_code, read.json()["status"]) == (200, "queued")
    assert not app.state.conveyor.replies._waiters  # none registered


async def test_a_wait_past_the_cap_is_cut_to_it_and_past_600_refused(
    client: httpx.AsyncClient,
) -> None:
    job_id = await _queued(client)
    url = f"/v1/jobs/{job_id}"
    capped = await asyncio.wait_for(client.get(url, params={"wait": 600}), timeout=30)
    assert (capped.status_code, capped.json()["status"]) == (200, "queued")
    for wait in (600.5, -1, "nan"):
        refused = await client.get(url, params={"wait": wait})
        assert refused.status_code == 422, (wait, refused.text)
    submitted = await client.post("/v1/jobs", params={"wait": 601}, json=QUEUED)
    assert submitted.status_code == 422, submitted.text

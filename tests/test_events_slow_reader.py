"""A stream whose client stopped reading, against the token hub on a real Valkey. The hub hands
every batch it reads to each listener without waiting (one reader serves every stream of a
partition); a listener that took none kept them all, the producer's memory growing by every step
of the job for as long as it ran. Now it keeps LISTENER_BACKLOG batches at most, and a follower
that fell behind reads what it missed from Redis: every event still comes once, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from producer_api.token_hub import (
    BEHIND,
    LISTENER_BACKLOG,
    Delivery,
    TagReader,
    TokenFollower,
    TokenHub,
)
from shared.codec import as_text
from shared.job_store import JobStore
from shared.keys import Keys, job_tag, new_job_id
from shared.redis_client import RedisClient, connect
from shared.token_stream import READ_COUNT, TokenEvent

KEYS = Keys()
APPENDED = 3 * LISTENER_BACKLOG  # entries, each read by the hub in a batch of its own


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[RedisClient]:
    client = connect(redis_url, blocks_ms=0)
    try:
        yield client
    finally:
        await client.aclose()


async def _append_one_batch_each(
    client: RedisClient, key: str, pacer: asyncio.Queue[Delivery], count: int
) -> list[str]:
    """Append `count` token entries, each only once the hub handed the last one to `pacer`: one
    batch per entry, as a paced engine's steps come."""
    ids = []
    for n in range(count):
        ids.append(as_text(await client.xadd(key, TokenEvent("token", f"{n} ", 1).encode())))
        while True:
            rows = await asyncio.wait_for(pacer.get(), 10)
            assert isinstance(rows, list), rows
            if as_text(rows[-1][0]) == ids[-1]:
                break
    return ids


async def test_a_listener_that_takes_nothing_holds_a_bounded_backlog(
    redis_url: str, client: RedisClient
) -> None:
    hub = TagReader(redis_url, client, "slow-wake", "slow-test")
    await hub.start()
    try:
        async with hub.listen("slow", "0-0") as stalled, hub.listen("slow", "0-0") as pacer:
            await _append_one_batch_each(client, "slow", pacer, APPENDED)
            assert stalled.qsize() <= LISTENER_BACKLOG
            assert stalled.get_nowait() is BEHIND
    finally:
        await hub.stop()


async def test_a_follower_that_fell_behind_gets_every_event_once(
    redis_url: str, client: RedisClient
) -> None:
    job_id = new_job_id("smollm2", "default")
    key = KEYS.tokens(job_id)
    await client.hset(KEYS.job(job_id), mapping={"status": "running", "model": "smollm2"})
    hub = TokenHub(redis_url, client, KEYS, "slow-test")
    follower = TokenFollower(hub, JobStore(client, KEYS, 3600), KEYS)
    first = as_text(await client.xadd(key, TokenEvent("token", "first ", 1).encode()))
    events = follower.follow(job_id)
    try:
        assert (await anext(events)).id == first  # then the client stops reading
        async with hub.listen(job_tag(job_id), key, "0-0") as pacer:
            ids = await _append_one_batch_each(client, key, pacer, APPENDED)
        final = TokenEvent("final", status="succeeded", finish_reason="length")
        ids.append(as_text(await client.xadd(key, final.encode())))
        await client.hset(KEYS.job(job_id), "status", "succeeded")
        rest = [event async for event in events]
    finally:
        await events.aclose()
        await hub.stop()
    assert [event.id for event in rest] == ids
    assert "".join(event.text for event in rest) == "".join(f"{n} " for n in range(APPENDED))


def _fields(event: TokenEvent) -> dict[Any, Any]:
    """An entry's fields as the worker's writer appends them (redis-py's types are narrower)."""
    return dict(event.encode())


async def _append_tokens(client: RedisClient, key: str, count: int) -> list[str]:
    async with client.pipeline(transaction=False) as pipe:
        for n in range(count):
            pipe.xadd(key, _fields(TokenEvent("token", f"{n} ", 1)))
        return [as_text(entry_id) for entry_id in await pipe.execute()]


async def test_a_follower_holds_one_page_of_what_its_client_did_not_take(
    redis_url: str, client: RedisClient
) -> None:
    """It read all that the stream held after its client's last event in one go (as it opened,
    after falling behind the hub, once the job ended): a client that opened late or read slowly
    had the producer hold the rest of its generation in memory. It reads a page (READ_COUNT
    entries) at a time now, each once the one before is sent. The probe: entries deleted from
    Redis after the client took its first event are sent only if the producer held them."""
    job_id = new_job_id("smollm2", "default")
    key = KEYS.tokens(job_id)
    await client.hset(KEYS.job(job_id), mapping={"status": "running", "model": "smollm2"})
    ids = await _append_tokens(client, key, 2 * READ_COUNT)  # a long generation, sent already
    hub = TokenHub(redis_url, client, KEYS, "pages-test")
    events = TokenFollower(hub, JobStore(client, KEYS, 3600), KEYS).follow(job_id)
    try:
        assert (await anext(events)).id == ids[0]  # then the client reads on, slowly
        await client.xdel(key, *ids[READ_COUNT:])  # what the producer did not hold is gone
        final = TokenEvent("final", status="succeeded", finish_reason="length")
        await client.xadd(key, _fields(final))
        await client.hset(KEYS.job(job_id), "status", "succeeded")
        rest = [event async for event in events]
    finally:
        await events.aclose()
        await hub.stop()
    assert [event.id for event in rest if not event.final] == ids[1:READ_COUNT]
    assert rest[-1].final

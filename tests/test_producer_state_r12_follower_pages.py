"""A token follower holds at most a page of its job's stream that its client has not taken, on a
real Valkey. It read all that the stream held after its client's last event in one go (as it
opened, after falling behind the hub, once the job ended): a client that opened late or read
slowly had the producer hold the rest of its generation, however long, in memory. It reads the
stream a page (READ_COUNT entries) at a time now, each once the one before is sent. The probe:
entries deleted from Redis after the client took its first event are sent only if the producer
held them already."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from producer_api.token_hub import TokenFollower, TokenHub
from shared.codec import as_text
from shared.job_store import JobStore
from shared.keys import Keys, new_job_id
from shared.redis_client import RedisClient, connect
from shared.token_stream import READ_COUNT, TokenEvent

KEYS = Keys()


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[RedisClient]:
    client = connect(redis_url, blocks_ms=0)
    try:
        yield client
    finally:
        await client.aclose()


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

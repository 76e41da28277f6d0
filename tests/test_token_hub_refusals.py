"""The token hub's reader against refusals that are the server's, not a followed stream's, on a
real Valkey. A write refused while the reader started (NOREPLICAS here; OOM or READONLY alike)
ended it for good: that partition's streams got no live tokens until the producer restarted.
A read refused for every key alike (NOPERM here; BUSY, CLUSTERDOWN, TRYAGAIN alike) dropped
every followed stream, each listener told its stream was unreadable, mid-generation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from producer_api.token_hub import StreamUnreadable, TagReader
from shared.redis_client import RedisClient, connect


@pytest.fixture
async def reader(redis_url: str) -> AsyncIterator[tuple[TagReader, RedisClient]]:
    client = connect(redis_url, blocks_ms=0)
    yield TagReader(redis_url, client, "refusals-wake", "refusals-test"), client
    await client.aclose()


@pytest.fixture
def refusing(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """The server, to be made to refuse; put back whatever the test left."""
    yield redis_client
    redis_client.config_set("min-replicas-to-write", 0)
    redis_client.execute_command("ACL", "SETUSER", "default", "+xread")


async def _token(client: RedisClient, key: str, queue: asyncio.Queue[object]) -> None:
    await client.xadd(key, {"kind": "token", "text": "hi", "tokens": 1})
    rows = await asyncio.wait_for(queue.get(), 5)
    assert not isinstance(rows, StreamUnreadable), rows
    assert isinstance(rows, list) and rows[-1][1][b"text"] == b"hi"


async def test_a_reader_started_while_writes_are_refused_serves_once_they_are_not(
    reader: tuple[TagReader, RedisClient], refusing: redis.Redis
) -> None:
    hub, client = reader
    refusing.config_set("min-replicas-to-write", 1)  # no replica: every write is NOREPLICAS
    await hub.start()
    try:
        await asyncio.sleep(0.3)
        refusing.config_set("min-replicas-to-write", 0)
        async with hub.listen("refused-at-start", "0-0") as queue:
            await _token(client, "refused-at-start", queue)
    finally:
        await hub.stop()


async def test_a_read_the_server_refuses_drops_no_stream(
    reader: tuple[TagReader, RedisClient], refusing: redis.Redis
) -> None:
    hub, client = reader
    await hub.start()
    try:
        async with hub.listen("first", "0-0") as first, hub.listen("second", "0-0") as second:
            await _token(client, "first", first)
            refusing.execute_command("ACL", "SETUSER", "default", "-xread")
            await client.xadd("first", {"kind": "token", "text": "hi", "tokens": 1})
            await asyncio.sleep(0.5)  # the reader's next XREADs: NOPERM
            refusing.execute_command("ACL", "SETUSER", "default", "+xread")
            rows = await asyncio.wait_for(first.get(), 5)  # the entry read before the refusal
            assert not isinstance(rows, StreamUnreadable), rows
            await _token(client, "second", second)
            await _token(client, "first", first)
    finally:
        await hub.stop()

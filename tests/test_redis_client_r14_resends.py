"""On a real Valkey, through a proxy that drops the reply to one request after the server ran it
(a connection torn at the worst time): a client `connect` made sends again what is safe to run
twice (a SET), and never a counter or an append (INCR, RPUSH), alone or in a pipeline: sent
again, the login throttle counted one failed login twice and a canary logged an event twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlparse

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.redis_client import RedisClient, connect
from tests.reply_dropper import ReplyDropper

Dropping = Callable[[bytes], Awaitable[RedisClient]]


@pytest.fixture
async def dropping(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[Dropping]:
    """A client `connect` made whose first request holding the marker loses its reply."""
    url = urlparse(redis_url)
    made: list[tuple[ReplyDropper, RedisClient]] = []

    async def make(marker: bytes) -> RedisClient:
        proxy = ReplyDropper(url.hostname or "127.0.0.1", url.port or 6379, marker)
        client = connect(await proxy.start(), name="r14-resends", blocks_ms=0)
        made.append((proxy, client))
        return client

    yield make
    for proxy, client in made:
        await client.aclose()
        await proxy.stop()
        assert proxy.dropped == 1


async def test_a_set_whose_reply_was_lost_is_sent_again(
    dropping: Dropping, aredis: aioredis.Redis
) -> None:
    client = await dropping(b"$3\r\nSET\r\n")
    assert await client.set("k", "v") is True
    assert await aredis.get("k") == b"v"


async def test_an_incr_whose_reply_was_lost_is_not_sent_again(
    dropping: Dropping, aredis: aioredis.Redis
) -> None:
    client = await dropping(b"$6\r\nINCRBY\r\n")
    with pytest.raises(RedisConnectionError):
        await client.incr("n")
    assert await aredis.get("n") == b"1"
    assert await client.incr("n") == 2  # the connection after is a new one


async def test_a_transaction_with_an_append_whose_reply_was_lost_is_not_sent_again(
    dropping: Dropping, aredis: aioredis.Redis
) -> None:
    client = await dropping(b"$5\r\nRPUSH\r\n")
    with pytest.raises(RedisConnectionError):
        async with client.pipeline(transaction=True) as pipe:
            pipe.rpush("events", "e1")
            pipe.expire("events", 60)
            await pipe.execute()
    assert await aredis.lrange("events", 0, -1) == [b"e1"]


@pytest.mark.parametrize(("queued", "resent"), [("incr", False), ("get", True)])
async def test_a_cluster_pipeline_carrying_an_incr_is_not_sent_again_by_redis_py(
    settings_env: Callable[..., None], queued: str, resent: bool
) -> None:
    """Against a peer that closes every connection it takes (a node gone), counted: redis-py's
    pipeline loop tries again what it may, and an INCR's pipeline once only."""
    tries = 0

    async def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal tries
        tries += 1
        writer.close()

    peer = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    settings_env(CONVEYOR_REDIS_CLUSTER="1")
    client = connect(f"redis://127.0.0.1:{peer.sockets[0].getsockname()[1]}", blocks_ms=0)
    try:
        pipe = client.pipeline(transaction=False)
        getattr(pipe, queued)("n")
        with pytest.raises(RedisConnectionError):
            await pipe.execute()
    finally:
        await client.aclose()
        peer.close()
    assert (tries > 1) is resent

"""A Redis timeout or connection error raised while the calling task is being cancelled is that
cancel: redis-py can raise one in its place (a race of its socket timeouts with an outer cancel
under Python 3.11), and a loop that waits out an outage took it for one and ran on for good.
The client raises CancelledError instead, chained from the Redis error; a timeout without a
cancel stays a timeout. On a real Valkey, through clients as `connect` makes them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.redis_client import RedisClient, connect
from tests.conftest import until_async
from tests.fault_engine import (
    LOSING,
    LosesCancels,
    SwallowsCancels,
    cancel_losing_client,
    raised_by,
)

LIST = "r39-cancel:unfilled"  # a list nobody fills: a BLPOP of it waits until cut


async def _blpop(client: RedisClient) -> object:
    return await client.blpop([LIST], 30)


async def _piped_blpop(client: RedisClient) -> object:
    async with client.pipeline(transaction=False) as pipe:
        pipe.blpop([LIST], 30)
        return await pipe.execute()


async def _blocked(aredis: aioredis.Redis) -> bool:
    return int((await aredis.info("clients"))["blocked_clients"]) > 0


@pytest.mark.parametrize("call", [_blpop, _piped_blpop], ids=["command", "pipeline"])
@LOSING
async def test_a_cancel_a_redis_call_lost_is_raised_as_the_cancel(
    aredis: aioredis.Redis,
    redis_url: str,
    call: Callable[[RedisClient], Awaitable[object]],
    losing: type[LosesCancels | SwallowsCancels],
    cause: type[BaseException | None],
) -> None:
    async with cancel_losing_client(redis_url, losing) as client:
        waiting = asyncio.create_task(raised_by(call(client)))
        await until_async(lambda: _blocked(aredis), timeout=5, every=0.01)
        waiting.cancel()
        raised = await waiting
    # before: the connection's RedisTimeoutError, or its nil as if the server had answered,
    # which a loop took for an outage or an empty read and ran on
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert isinstance(raised.__cause__, cause)


async def test_a_redis_timeout_without_a_cancel_stays_a_timeout(redis_url: str) -> None:
    client = connect(redis_url, blocks_ms=0, timeout_s=0.2)
    try:
        with pytest.raises(RedisTimeoutError):
            await client.blpop([LIST], 5)  # the socket's 0.2 s timeout cuts it
    finally:
        await client.aclose()

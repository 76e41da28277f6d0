"""A cancel lost inside a pub/sub call (redis-py raising a Redis timeout in its place, or
answering as if the server had) is raised as the cancel, as it is for every other Redis call
(`shared/redis_client._KeepsCancel`): pub/sub calls are not the client's commands, and went
unguarded. The reply listener's task took the timeout for an outage, reconnected and listened
on after its cancel; a cancel swallowed whole left it reading, through every later cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from producer_api.reply_listener import ONE_SERVER, ReplyListener
from shared.job_store import JobStore
from shared.keys import Keys
from shared.redis_client import subscriber
from tests.conftest import until_async
from tests.fault_engine import (
    LOSING,
    LosesCancels,
    SwallowsCancels,
    cancel_losing_client,
    raised_by,
)

CHANNEL = "leftover:{t1}:unheard"  # a channel nobody publishes on: a read waits until cut


async def _get_message(pubsub: aioredis.client.PubSub) -> object:
    return await pubsub.get_message(timeout=30)


async def _listen(pubsub: aioredis.client.PubSub) -> object:
    async for message in pubsub.listen():
        if message["type"] == "smessage":
            return message
    return None


@pytest.mark.parametrize("read", [_get_message, _listen], ids=["get_message", "listen"])
@LOSING
async def test_a_cancel_a_pubsub_read_lost_is_raised_as_the_cancel(
    redis_url: str,
    read: Callable[[aioredis.client.PubSub], Awaitable[object]],
    losing: type[LosesCancels | SwallowsCancels],
    cause: type[BaseException | None],
) -> None:
    async with cancel_losing_client(redis_url, losing) as client:
        pubsub = subscriber(client).pubsub()
        try:
            await pubsub.ssubscribe(CHANNEL)
            assert (await pubsub.get_message(timeout=5) or {}).get("type") == "ssubscribe"
            reading = asyncio.create_task(raised_by(read(pubsub)))
            await asyncio.sleep(0.2)  # into its read: nothing is published
            reading.cancel()
            await asyncio.wait({reading}, timeout=5)
        finally:
            await pubsub.aclose()  # a read still going (before: `listen`) ends with its connection
        raised = await reading
    # before: the connection's RedisTimeoutError, or its nil read as no message (get_message
    # returned None; listen read on for good)
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert isinstance(raised.__cause__, cause)


async def _subscribed(aredis: aioredis.Redis) -> bool:
    return any(peer.get("ssub") == "1" for peer in await aredis.client_list())


async def test_the_reply_listener_ends_at_its_cancel(redis_url: str, aredis: Any) -> None:
    """Cancelled once (as a TaskGroup or a timeout cancels), its cancel lost as a timeout."""
    async with cancel_losing_client(redis_url, LosesCancels) as client:
        keys = Keys()
        listener = ReplyListener(client, keys, "leftover", JobStore(client, keys, 60))
        await listener.start(["t1"])
        listening = listener._tasks[ONE_SERVER]
        try:
            await until_async(lambda: _subscribed(aredis), timeout=5, every=0.01)
            await asyncio.sleep(0.2)  # into its read
            listening.cancel()
            await asyncio.wait({listening}, timeout=5)
            # before: the timeout taken for an outage; it reconnected and listened on
            assert listening.cancelled(), listening
        finally:
            await listener.stop()


async def _ssubscribe(pubsub: aioredis.client.PubSub) -> object:
    return await pubsub.ssubscribe(CHANNEL)


async def _connect(pubsub: aioredis.client.PubSub) -> object:
    return await pubsub.connect()  # the reply listener's reconnection


@pytest.mark.parametrize("call", [_ssubscribe, _connect], ids=["command", "connect"])
async def test_a_cancel_lost_while_connecting_is_raised_as_the_cancel(
    call: Callable[[aioredis.client.PubSub], Awaitable[object]],
) -> None:
    """A server that takes the connection and never answers its handshake (HELLO): the
    subscription's connection waits in a read, where the cancel is lost as a timeout."""
    accepted = asyncio.Event()

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await asyncio.sleep(30)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with cancel_losing_client(f"redis://127.0.0.1:{port}") as client:
            pubsub = subscriber(client).pubsub()
            calling = asyncio.create_task(raised_by(call(pubsub)))
            await asyncio.wait_for(accepted.wait(), timeout=5)
            await asyncio.sleep(0.1)  # into the handshake's read
            calling.cancel()
            raised = await calling
            await pubsub.aclose()
    finally:
        server.close()
    # before: the handshake's RedisTimeoutError, which the listener took for an outage
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert isinstance(raised.__cause__, RedisTimeoutError)

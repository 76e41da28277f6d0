"""Group commit honours the shared client's rule: a command that a second run changes the outcome
of (`RUNS_TWICE`), alone or in a flush's pipeline, is not sent again by redis-py after its reply
was lost; its caller meets the lost connection instead of counting twice."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from producer_api.jobs.group_commit import group_committing
from shared.redis_client import connect


class _LosesOneReply:
    """A TCP relay to Valkey that closes the connection which first sent an INCR as soon as the
    server answers it, before the answer reaches the client: the server ran the command, its
    reply is lost. Every other connection and reply passes."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.lost = False
        self.relays: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        counting = asyncio.Event()  # this connection sent an INCR
        for task in (
            asyncio.ensure_future(self._up(reader, up_writer, counting)),
            asyncio.ensure_future(self._down(up_reader, writer, counting)),
        ):
            self.relays.add(task)
            task.add_done_callback(self.relays.discard)

    async def _up(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counting: asyncio.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if b"INCR" in data.upper():
                    counting.set()
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _down(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counting: asyncio.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if counting.is_set() and not self.lost:
                    self.lost = True
                    break
                writer.write(data)
                await writer.drain()
        writer.close()


@pytest.fixture
async def lossy_url(redis_url: str) -> AsyncIterator[str]:
    target = urlsplit(redis_url)
    relay = _LosesOneReply(target.hostname or "localhost", target.port or 6379)
    server = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"redis://127.0.0.1:{port}/0"
    server.close()
    for task in list(relay.relays):
        task.cancel()


async def _counted_once(lossy_url: str, aredis: aioredis.Redis, keys: list[str]) -> None:
    """INCR each key in one turn through a group-committing client whose first reply is lost:
    the callers see the lost connection, and each counter counted once."""
    client = connect(lossy_url, name="r16", blocks_ms=0, cluster=False)
    hot = group_committing(client, lossy_url, "r16-hot")
    try:
        results = await asyncio.gather(*(hot.incr(key) for key in keys), return_exceptions=True)
    finally:
        await client.aclose()
    assert all(isinstance(result, RedisConnectionError) for result in results), results
    assert [int(await aredis.get(key) or 0) for key in keys] == [1] * len(keys)


async def test_a_lone_counter_whose_reply_was_lost_counts_once(
    lossy_url: str, aredis: aioredis.Redis
) -> None:
    await _counted_once(lossy_url, aredis, ["r16:lone"])


async def test_a_flush_carrying_a_counter_whose_reply_was_lost_is_not_sent_again(
    lossy_url: str, aredis: aioredis.Redis
) -> None:
    await _counted_once(lossy_url, aredis, ["r16:a", "r16:b", "r16:c"])

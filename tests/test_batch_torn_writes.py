"""A create's lists (a batch's items, each partition's items, its refused lines) carry their TTL
however the connection that writes them is torn. They were written as a pipeline's DEL, RPUSH
and EXPIRE, which the server runs one by one as they arrive: a connection torn after an RPUSH
reached it (the producer died, the network dropped) left that list with no TTL, a key kept for
ever beside a batch whose hash expired. On a real Valkey, behind a proxy that passes on only the
first bytes of a connection, at every length."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from shared.batch_api_store import BatchApiStore
from shared.keys import Keys

KEYS = Keys("torn:")
TTL_S = 600
ITEMS = [(f"job-{n}", KEYS.batch_open("batch_torn", "m", "default")) for n in range(3)]
REFUSED = [b'{"line": 4}']
Pump = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class CuttingProxy:
    """Passes a connection's bytes on to Valkey, and Valkey's back; with `cut`, only the first
    `cut` bytes the connection sends, then it ends the connection once Valkey has answered what
    it received (so what Valkey did is done when the client sees the connection drop).
    `passed` counts the bytes the last connection sent on."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.cut: int | None = None
        self.passed = 0

    async def serve(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        server, to_server = await asyncio.open_connection(*self.upstream)
        self.passed = 0
        try:
            await asyncio.gather(self._up(client, to_server, self.cut), _down(server, to_client))
        finally:
            to_client.close()
            to_server.close()

    async def _up(
        self, client: asyncio.StreamReader, to: asyncio.StreamWriter, cut: int | None
    ) -> None:
        while cut is None or self.passed < cut:
            data = await client.read(65536)
            if not data:
                break
            data = data if cut is None else data[: cut - self.passed]
            to.write(data)
            await to.drain()
            self.passed += len(data)
        to.write_eof()


async def _down(server: asyncio.StreamReader, to: asyncio.StreamWriter) -> None:
    while data := await server.read(65536):
        to.write(data)
        with contextlib.suppress(ConnectionError):
            await to.drain()


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[tuple[CuttingProxy, int]]:
    address = urlsplit(redis_url)
    cutting = CuttingProxy(address.hostname or "127.0.0.1", address.port or 6379)
    server = await asyncio.start_server(cutting.serve, "127.0.0.1", 0)
    async with server:
        yield cutting, server.sockets[0].getsockname()[1]


async def _add_items(port: int, batch_id: str) -> None:
    """The create's `add_items` on a connection of its own, never sent again."""
    client = aioredis.Redis(port=port, retry=Retry(NoBackoff(), 0))
    try:
        await BatchApiStore(client, KEYS, TTL_S).add_items(batch_id, ITEMS, REFUSED, TTL_S)
    finally:
        await client.aclose()


async def test_a_list_written_is_written_whole_with_its_ttl_wherever_its_connection_is_cut(
    aredis: aioredis.Redis, proxy: tuple[CuttingProxy, int]
) -> None:
    cutting, port = proxy
    direct = BatchApiStore(aredis, KEYS, TTL_S)
    await direct.add_items("batch_loaded", ITEMS, REFUSED, TTL_S)  # its scripts loaded
    await _add_items(port, "batch_whole")
    whole = cutting.passed  # every byte of a connection that writes the lists
    expected = {
        KEYS.batch_items("batch_torn"): [job_id.encode() for job_id, _ in ITEMS],
        ITEMS[0][1]: [job_id.encode() for job_id, _ in ITEMS],
        KEYS.batch_rejected("batch_torn"): REFUSED,
    }
    written = 0
    for cut in range(1, whole):
        cutting.cut = cut
        with contextlib.suppress(RedisError):
            await _add_items(port, "batch_torn")
        for key, values in expected.items():
            if await aredis.exists(key):
                written += 1
                assert await aredis.ttl(key) > 0, (cut, key)
                assert await aredis.lrange(key, 0, -1) == values, (cut, key)
                await aredis.delete(key)
    assert written > 0  # some cuts came after a list's write

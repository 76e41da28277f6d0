"""A keyed submit cut short by its client's leaving gives its idempotency key back though the
disconnect watch cancels it again every RECANCEL_S while it does: on a slow Redis (replies lagged
by a real TCP relay) the second cancel cut the give-back short, and the key stayed claimed with no
job behind it, every retry with it a 409 until the claim was taken over as abandoned (60 s)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import partial
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from producer_api import client_disconnect
from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async
from tests.test_group_commit_r16_disconnect import KeyedLeaving
from tests.test_long_poll_r13_disconnect import PREFIX, QUEUED, WAIT, Producer

LAG_S = 0.3  # each reply's, once lagging: three times the watch's RECANCEL_S


class _Lagging:
    """A TCP relay to Valkey that, once `lag` is set, hands every reply to the client that long
    after the server sent it: a slow Redis (latency, each command still run)."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.lag = 0.0
        self.relays: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        for task in (
            asyncio.ensure_future(self._pipe(reader, up_writer, lagged=False)),
            asyncio.ensure_future(self._pipe(up_reader, writer, lagged=True)),
        ):
            self.relays.add(task)
            task.add_done_callback(self.relays.discard)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, lagged: bool
    ) -> None:
        """Each chunk passed on `lag` after it came (in order: same-lag timers keep theirs)."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                loop.call_at(loop.time() + (self.lag if lagged else 0), writer.write, data)
        loop.call_at(loop.time() + (self.lag if lagged else 0), writer.close)


@pytest.fixture
async def relay(redis_url: str) -> AsyncIterator[tuple[_Lagging, str]]:
    target = urlsplit(redis_url)
    lagging = _Lagging(target.hostname or "localhost", target.port or 6379)
    server = await asyncio.start_server(lagging.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield lagging, f"redis://127.0.0.1:{port}/0"
    server.close()
    for task in list(lagging.relays):
        task.cancel()


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/readyz")).status_code == 200


@pytest.fixture
async def producer(
    relay: tuple[_Lagging, str], aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Producer]:
    """A ready producer whose Redis is reached through the relay (its start-up not lagged); its
    disconnect watch starts within a lagged reply (its 0.5 s would cost the test seconds of lag)."""
    monkeypatch.setattr(client_disconnect, "WATCH_AFTER_S", 0.05)
    app = create_app(Settings(redis_url=relay[1], key_prefix=PREFIX, auth="disabled"))
    async with app_client(app) as client:
        await until_async(partial(_ready, client), timeout=5, every=0.01)
        yield Producer(app, client)


async def test_a_keyed_submit_cut_short_on_a_slow_redis_gives_its_key_back(
    producer: Producer, relay: tuple[_Lagging, str], aredis: aioredis.Redis
) -> None:
    lagging, _ = relay
    left = KeyedLeaving("POST", f"/v1/jobs?wait={WAIT}", orjson.dumps(QUEUED))
    left.gone.set()  # the client is gone by the time the watch listens
    lagging.lag = LAG_S  # the watch cancels the claim's SET mid-reply, again in the clean-up
    try:
        await producer.app(left.scope(), left.receive, left.send)
    finally:
        lagging.lag = 0.0
    assert left.status() == 499
    assert [key async for key in aredis.scan_iter(f"{PREFIX}job:*")] == []  # nothing enqueued
    assert [key async for key in aredis.scan_iter(f"{PREFIX}idem:*")] == []  # the key given back

"""A batch or an upload named by its path is sent from disk as it is read, in httpx's 64 KiB
chunks, not read whole first: a batch of CONVEYOR_MAX_UPLOAD_BYTES (100 MiB) was held in the
client's memory before a byte went out. A create retried after its connection dropped mid-body
sends the whole file again, from its start. A producer served in-process over a real Valkey,
spoken to through a transport that notes each chunk the client hands httpx; no worker."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from conveyor.client import AsyncClient, Client, RetryPolicy
from conveyor.commands.files import jsonl_source
from producer_api.app import create_app
from shared.settings import Settings

CHUNK = 64 * 1024  # httpx's own chunk for a file it reads
LINES = 600


class Noted(httpx.AsyncBaseTransport):
    """The producer's ASGI transport, noting the size of each chunk of each request body;
    the first `drops` requests are cut after their first chunk, as a connection that drops
    mid-upload."""

    def __init__(self, inner: httpx.AsyncBaseTransport, drops: int = 0) -> None:
        self.inner = inner
        self.drops = drops
        self.bodies: list[list[int]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sizes: list[int] = []
        self.bodies.append(sizes)
        if self.drops:
            self.drops -= 1
            async for chunk in _chunks(request.stream):
                sizes.append(len(chunk))
                raise httpx.WriteError("connection dropped mid-body")
        request.stream = httpx.ByteStream(b"".join([c async for c in _noting(request, sizes)]))
        return await self.inner.handle_async_request(request)


async def _chunks(stream: object) -> AsyncIterator[bytes]:
    """A request body's chunks, whichever client (sync or async) made it."""
    if isinstance(stream, httpx.AsyncByteStream):
        async for chunk in stream:
            yield chunk
    else:
        assert isinstance(stream, httpx.SyncByteStream)
        for chunk in stream:
            yield chunk


async def _noting(request: httpx.Request, sizes: list[int]) -> AsyncIterator[bytes]:
    async for chunk in _chunks(request.stream):
        sizes.append(len(chunk))
        yield chunk


class Bridge(httpx.BaseTransport):
    """A blocking `Client`'s requests, run on the test's loop through `Noted` (the app is
    served there): the sync SDK on a thread of its own."""

    def __init__(self, noted: Noted, loop: asyncio.AbstractEventLoop) -> None:
        self.noted = noted
        self.loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = asyncio.run_coroutine_threadsafe(self._send(request), self.loop).result()
        return answer

    async def _send(self, request: httpx.Request) -> httpx.Response:
        response = await self.noted.handle_async_request(request)
        body = await response.aread()
        return httpx.Response(response.status_code, headers=response.headers, content=body)


@pytest.fixture
async def noted(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[Noted]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="batch-cli-r20")
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield Noted(httpx.ASGITransport(app=app))


@pytest.fixture
def batch_file(tmp_path: Path) -> Path:
    """About 300 KiB of lines: several of httpx's chunks."""
    path = tmp_path / "big.jsonl"
    pad = "x" * 480
    lines = (
        {"custom_id": f"l{i}", "body": {"model": "identity", "inputs": {"pad": pad}}}
        for i in range(LINES)
    )
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


@pytest.fixture
async def sync_client(noted: Noted) -> AsyncIterator[Client]:
    with Client("http://localhost") as client:
        client.http.close()
        bridge = Bridge(noted, asyncio.get_running_loop())
        client.http = httpx.Client(transport=bridge, base_url="http://localhost")
        yield client


def _streamed(sizes: list[int], total: int) -> None:
    assert sum(sizes) == total
    assert len(sizes) > 1 and max(sizes) <= CHUNK, sizes[:4]


async def test_a_batch_file_is_streamed_and_resent_whole_after_a_dropped_connection(
    noted: Noted, batch_file: Path
) -> None:
    noted.drops = 1
    size = batch_file.stat().st_size
    async with AsyncClient("http://localhost", retry=RetryPolicy(base_s=0)) as client:
        await client.http.aclose()
        client.http = httpx.AsyncClient(transport=noted, base_url="http://localhost")
        batch = await client.batches.create(batch_file)
        upload = await client.files.create(batch_file)

    assert batch.counts.total == LINES
    dropped, resent, uploaded = noted.bodies
    assert dropped and max(dropped) <= CHUNK, dropped[:4]  # cut after its first chunk
    _streamed(resent, size)
    assert upload.bytes == size
    assert len(uploaded) > 1 and max(uploaded) <= CHUNK, uploaded[:4]


async def test_a_blocking_clients_batch_and_upload_are_streamed(
    noted: Noted, batch_file: Path, sync_client: Client
) -> None:
    size = batch_file.stat().st_size

    batch = await asyncio.to_thread(sync_client.batches.create, batch_file)
    upload = await asyncio.to_thread(sync_client.files.create, str(batch_file))

    assert batch.counts.total == LINES
    assert (upload.bytes, upload.filename) == (size, "big.jsonl")
    batch_body, upload_body = noted.bodies
    _streamed(batch_body, size)
    assert len(upload_body) > 1 and max(upload_body) <= CHUNK, upload_body[:4]
    content = await asyncio.to_thread(sync_client.files.content, upload.id)
    assert content == batch_file.read_bytes()


async def test_standard_input_is_sent_from_disk_as_a_file_is(
    noted: Noted, batch_file: Path, sync_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`conveyor files upload -` / `batch submit -`: the piped lines were read whole."""
    piped = batch_file.read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(piped)))

    with jsonl_source(Path("-")) as source:
        upload = await asyncio.to_thread(sync_client.files.create, source)

    assert upload.filename == "batch.jsonl"
    (body,) = noted.bodies
    assert len(body) > 1 and max(body) <= CHUNK, body[:4]
    assert await asyncio.to_thread(sync_client.files.content, upload.id) == piped

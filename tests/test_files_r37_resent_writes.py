"""A tenant's file budget when a write of the Files API lost its reply after Redis ran it (a
connection torn at the worst time, through a real proxy to a real Valkey), and the producer's
client sent it again, as it sends scripts and transactions of commands safe to repeat:
- an upload's hold of its bytes ran twice and charged them twice: with room for one file, the
  upload that fitted was refused 429 `insufficient_quota` by its own first run (with more room,
  the file held twice its size for as long as the tenant kept uploading);
- a delete's transaction ran twice: the second found the file gone, so nothing gave its bytes
  back, and the tenant's next upload was refused 429 until the file would have expired (a result
  TTL). The delete still answers the 404 of a file already gone (what its second run found).
A delete cut short once the file was gone (a timeout, a producer that died) left its bytes held
the same way, and its retry's 404 gave none back either."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from urllib.parse import urlparse

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.file_store import HOLD, charged
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.reply_dropper import ReplyDropper

LINE = b'{"custom_id": "a", "body": {"inputs": {"x": 1}}}\n'
ONE_FILE = charged("a.jsonl", len(LINE))  # the budget: room for one file
# What a proxy drops the reply to: the first call of the hold script (by its sha; it is loaded
# first, so the reply lost is the hold's own, not a NOSCRIPT), the first DEL (a delete's).
HOLD_CALL = hashlib.sha1(HOLD.encode()).hexdigest().encode()
DEL = b"$3\r\nDEL\r\n"

Producer = Callable[[bytes], AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def keys() -> Keys:
    return Keys(f"r37-resent-{uuid.uuid4().hex[:8]}:")


def _settings(redis_url: str, keys: Keys) -> Settings:
    """A producer's; the tenant's budget has room for one file."""
    return Settings(
        redis_url=redis_url,
        auth="disabled",
        key_prefix=keys.prefix,
        max_file_bytes_per_tenant=ONE_FILE,
    )


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis, keys: Keys) -> Producer:
    """A producer whose Redis is behind a proxy that loses the reply to the first request
    holding a marker."""
    await aredis.script_load(HOLD)
    url = urlparse(redis_url)

    @asynccontextmanager
    async def serve(marker: bytes) -> AsyncIterator[httpx.AsyncClient]:
        proxy = ReplyDropper(url.hostname or "127.0.0.1", url.port or 6379, marker)
        try:
            async with app_client(create_app(_settings(await proxy.start(), keys))) as client:
                yield client
            assert proxy.dropped == 1
        finally:
            await proxy.stop()

    return serve


async def _upload(client: httpx.AsyncClient) -> httpx.Response:
    files = {"file": ("a.jsonl", LINE)}
    return await client.post("/v1/files", files=files, data={"purpose": "batch"})


def _held(aredis: aioredis.Redis, keys: Keys) -> Awaitable[bytes | None]:
    held, _ = keys.file_budget_of("default")
    return aredis.hget(held, "total")


async def test_an_upload_whose_hold_was_sent_again_is_held_once(
    producer: Producer, aredis: aioredis.Redis, keys: Keys
) -> None:
    async with producer(HOLD_CALL) as client:
        uploaded = await _upload(client)
        assert uploaded.status_code == 200, uploaded.text
        assert int(await _held(aredis, keys) or 0) == ONE_FILE  # charged once

        deleted = await client.delete(f"/v1/files/{uploaded.json()['id']}")
        assert deleted.json()["deleted"] is True, deleted.text
        assert int(await _held(aredis, keys) or 0) == 0  # all of it given back


async def test_a_delete_sent_again_gives_the_files_bytes_back(
    producer: Producer, aredis: aioredis.Redis, keys: Keys
) -> None:
    async with producer(DEL) as client:
        file_id = (await _upload(client)).json()["id"]

        await client.delete(f"/v1/files/{file_id}")  # its reply lost, sent again

        assert (await client.get(f"/v1/files/{file_id}")).status_code == 404  # it is gone
        assert int(await _held(aredis, keys) or 0) == 0
        assert await aredis.zrange(keys.files_of("default"), 0, -1) == []  # and unlisted
        again = await _upload(client)
        assert again.status_code == 200, again.text


async def test_the_retry_of_a_delete_cut_short_gives_the_files_bytes_back(
    redis_url: str, aredis: aioredis.Redis, keys: Keys
) -> None:
    """The file gone and its bytes still held: what a delete leaves that stopped between the
    two (a timeout, its producer killed). A delete of an id the tenant never held gives back
    nothing, nor does one of `total`, the budget's own field."""
    async with app_client(create_app(_settings(redis_url, keys))) as client:
        file_id = (await _upload(client)).json()["id"]
        await aredis.delete(keys.file(file_id))  # the delete's transaction ran, nothing after
        for odd in ("total", f"file-{uuid.uuid4().hex}"):
            assert (await client.delete(f"/v1/files/{odd}")).status_code == 404
        assert int(await _held(aredis, keys) or 0) == ONE_FILE  # nothing given back for those

        retried = await client.delete(f"/v1/files/{file_id}")

        assert retried.status_code == 404, retried.text  # gone already
        assert int(await _held(aredis, keys) or 0) == 0
        assert (await _upload(client)).status_code == 200

"""`GET /v1/files` paged on, as OpenAI's clients page, past more entries whose files are gone
than a page reads (PAGE_ROUNDS): such a page stopped early, empty, `has_more` true, and the
official client, which stops at an empty page and goes on after its last file, missed the files
after them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.file_store import FileStore
from shared.job_store import now_ms
from shared.keys import Keys
from shared.settings import Settings

TENANT = "default"  # the anonymous principal's, auth disabled
PAGE_FIELDS = {"object", "data", "first_id", "last_id", "has_more"}
LIMIT = 2
GONE = 120  # more than the 4 reads of a page take at LIMIT 2 (3 + 6 + 12 + 24)


@pytest.fixture
async def transport(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.ASGITransport]:
    """The producer's app, started, as an HTTP transport."""
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="files-paging"))
    async with app.router.lifespan_context(app):
        yield httpx.ASGITransport(app=app)


@pytest.fixture
async def client(transport: httpx.ASGITransport) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        yield http


async def _put(store: FileStore, name: str) -> str:
    await asyncio.sleep(0.002)  # scored by the ms each was uploaded in
    fields = {"tenant": TENANT, "filename": f"{name}.jsonl", "purpose": "batch"}
    await store.put(name, {**fields, "bytes": "3", "created_at": str(now_ms() // 1000)}, b"{}\n")
    return name


async def _paged(
    client: httpx.AsyncClient, **params: Any
) -> tuple[list[str], list[dict[str, Any]]]:
    """Every file id listed following `after=last_id` while `has_more`, and the pages."""
    listed: list[str] = []
    pages: list[dict[str, Any]] = []
    after: str | None = None
    for _ in range(10):  # a client that started over would never end
        query = {**params, **({"after": after} if after else {})}
        response = await client.get("/v1/files", params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        assert page["object"] == "list" and set(page) == PAGE_FIELDS  # OpenAI's list
        pages.append(page)
        listed += [file["id"] for file in page["data"]]
        if not page["has_more"]:
            return listed, pages
        assert page["data"] and page["last_id"] is not None, page  # OpenAI's clients stop
        after = page["last_id"]
    raise AssertionError(f"still paging after {len(pages)} pages: {listed}")


async def test_the_official_client_lists_every_file_past_files_gone_before_their_entries(
    transport: httpx.ASGITransport, aredis: aioredis.Redis
) -> None:
    """Files whose keys went before their index entries (evicted, or a delete whose unlist
    failed), between live ones: no page is empty while more follow, so OpenAI's client (its
    cursor is the last file of a page) lists every live file, each once, in order."""
    store = FileStore(aredis, Keys(), 600)
    old = [await _put(store, f"file-old-{n}") for n in range(2)]
    await asyncio.sleep(0.002)
    gone = {f"file-gone-{n:03}": now_ms() for n in range(GONE)}
    await aredis.zadd(Keys().files_of(TENANT), gone)  # listed, their keys gone
    new = [await _put(store, f"file-new-{n}") for n in range(2)]
    async with httpx.AsyncClient(transport=transport) as http:
        sdk = openai.AsyncOpenAI(
            base_url="http://localhost/v1", api_key="unused", http_client=http, max_retries=0
        )
        listed = [file.id async for file in sdk.files.list(limit=LIMIT)]
    assert listed == new[::-1] + old[::-1]


async def test_an_oldest_first_listing_reaches_the_files_after_expired_ones(
    client: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """Entries a file's lifetime old (their files expired, no upload since to drop them) ahead
    of live ones, oldest first: an unlisted entry's score is kept no longer than a file lives,
    so a page after the last one read listed nothing; they now leave the index before a
    listing reads it."""
    store = FileStore(aredis, Keys(), 600)
    live = [await _put(store, f"file-live-{n}") for n in range(3)]  # an upload drops them
    await aredis.zadd(Keys().files_of(TENANT), {f"file-expired-{n:03}": n for n in range(GONE)})
    listed, pages = await _paged(client, limit=LIMIT, order="asc")
    assert listed == live
    assert not pages[-1]["has_more"]

"""`GET /v1/files` followed by `after=last_id`, as OpenAI's clients page, past more entries whose
files are gone than a page reads (PAGE_ROUNDS): such a page stopped early, empty, `has_more`
true and no `last_id`, so a client started over from the first page (and saw it again)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
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
async def client(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="files-paging"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
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
        assert page["last_id"] is not None, page  # else the client has no cursor
        after = page["last_id"]
    raise AssertionError(f"still paging after {len(pages)} pages: {listed}")


async def test_pages_past_files_gone_before_their_entries_go_on_from_the_last_one_read(
    client: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """Files whose keys went before their index entries (evicted, or a delete whose unlist
    failed), between live ones: an empty page names where it stopped, and the next goes on."""
    store = FileStore(aredis, Keys(), 600)
    old = [await _put(store, f"file-old-{n}") for n in range(2)]
    await asyncio.sleep(0.002)
    gone = {f"file-gone-{n:03}": now_ms() for n in range(GONE)}
    await aredis.zadd(Keys().files_of(TENANT), gone)  # listed, their keys gone
    new = [await _put(store, f"file-new-{n}") for n in range(2)]
    listed, pages = await _paged(client, limit=LIMIT)
    assert listed == new[::-1] + old[::-1]  # each once, in order
    assert any(not page["data"] and page["has_more"] for page in pages)  # one stopped early
    assert pages[-1]["data"] and not pages[-1]["has_more"]


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

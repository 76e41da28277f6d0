"""A tenant's listing (OpenAI's `GET /v1/files` and `/v1/batches`) paged with `after`, on a real
Valkey, no stack: the page starts right after `after`, in either order, even when a record is
indexed while the page is read."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from shared.file_store import FileStore
from shared.keys import Keys

KEYS = Keys("tp:")
KEEP_S = 60


@pytest.fixture
async def indexed(aredis: aioredis.Redis) -> tuple[FileStore, list[str]]:
    """A file store and six files of tenant acme, oldest first, each in its own millisecond."""
    store = FileStore(aredis, KEYS, KEEP_S)
    ids = [f"file-{n}" for n in range(6)]
    for file_id in ids:
        await store.enlist("acme", file_id)
        await asyncio.sleep(0.003)
    return store, ids


async def test_a_page_starts_after_the_id_it_is_given_in_either_order(
    indexed: tuple[FileStore, list[str]],
) -> None:
    store, ids = indexed
    assert await store.listed("acme", None, 2) == [ids[5], ids[4]]  # newest first
    assert await store.listed("acme", ids[3], 2) == [ids[2], ids[1]]
    assert await store.listed("acme", ids[1], 5) == [ids[0]]
    assert await store.listed("acme", ids[3], 2, newest_first=False) == [ids[4], ids[5]]
    assert await store.listed("acme", ids[5], 2, newest_first=False) == []
    assert await store.listed("acme", "file-unknown", 2) == []
    assert await store.listed("nobody", ids[3], 2) == []


class _IndexingMeanwhile:
    """The store's client, through which one more (newer) file is indexed right after the
    store ranks `after`, had it ranked it in a call of its own."""

    def __init__(self, client: aioredis.Redis, store: FileStore) -> None:
        self.client = client
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def zrevrank(self, key: str, member: str) -> Any:
        rank = await self.client.zrevrank(key, member)
        await self.store.enlist("acme", "file-new")
        return rank


async def test_a_record_indexed_while_a_page_is_read_does_not_repeat_the_one_before_it(
    aredis: aioredis.Redis, indexed: tuple[FileStore, list[str]]
) -> None:
    store, ids = indexed
    paging = FileStore(_IndexingMeanwhile(aredis, store), KEYS, KEEP_S)  # type: ignore[arg-type]
    page = await paging.listed("acme", ids[3], 2)
    assert ids[3] not in page and page == [ids[2], ids[1]], page

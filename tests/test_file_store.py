"""A tenant's files listed a page at a time on a real Valkey, while the client deletes what it
lists (the usual "delete every file" loop): the page after a deleted id was empty, so the loop
stopped with files left."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from shared.file_store import FileStore, OverBudget
from shared.job_store import now_ms
from shared.keys import Keys
from shared.tenant_index import CHUNK

KEYS = Keys("files:")


async def _page(
    store: FileStore, tenant: str, after: str | None, limit: int, newest_first: bool = True
) -> tuple[list[tuple[str, dict[str, str]]], bool]:
    """A page of the tenant's files as FilesService reads it: (id, fields) pairs, whether more
    follow."""
    page = await store.page(tenant, after, limit, store.fields_many, newest_first)
    return page.found, page.more


async def test_the_page_after_a_deleted_file_lists_the_rest(aredis: aioredis.Redis) -> None:
    store = FileStore(aredis, KEYS, 600)
    for n in range(3):
        await store.put(f"file-{n}", {"tenant": "acme", "filename": f"{n}.jsonl"}, b"{}\n")
    listed: list[str] = []
    after = None
    while True:
        page, more = await _page(store, "acme", after, 1)
        for file_id, _ in page:
            listed.append(file_id)
            await store.delete(file_id)  # the client deletes what it lists
        if not more:
            break
        after = page[-1][0]
    assert listed == ["file-2", "file-1", "file-0"]
    assert await _page(store, "acme", None, 10) == ([], False)


async def test_a_page_after_a_file_another_listing_dropped_goes_on_from_its_place(
    aredis: aioredis.Redis,
) -> None:
    """A file whose keys expired leaves the index when a listing finds it gone; a client that
    held it as its `after` then got an empty page (`has_more` false), files left unlisted."""
    store = FileStore(aredis, KEYS, 600)
    for n in range(4):
        await store.put(f"file-{n}", {"tenant": "acme", "filename": f"{n}.jsonl"}, b"{}\n")
        await asyncio.sleep(0.002)  # scored by the ms each was uploaded in
    first, more = await _page(store, "acme", None, 2)
    assert [file_id for file_id, _ in first] == ["file-3", "file-2"] and more
    await aredis.delete(KEYS.file("file-2"))  # its TTL ran out
    await _page(store, "acme", None, 10)  # another listing
    assert "file-2" not in await store.listed("acme", None, 10)  # dropped from the index
    rest, more = await _page(store, "acme", "file-2", 2)
    assert [file_id for file_id, _ in rest] == ["file-1", "file-0"] and not more


async def test_what_a_listing_drops_is_kept_only_a_files_lifetime_past_its_listing(
    aredis: aioredis.Redis,
) -> None:
    """The ids a listing dropped were kept in a key that never expired once the tenant had
    deleted all it listed (its TTL was read from the index after the index was gone), and that
    grew by every dropped id for as long as the tenant stayed active. A score is kept a
    lifetime past its file's, so a cursor outlives its entry by one."""
    store = FileStore(aredis, KEYS, 60)
    dropped = KEYS.files_unlisted_of("acme")
    await store.put("file-a", {"tenant": "acme", "filename": "a.jsonl"}, b"{}\n")
    await store.delete("file-a")
    assert await _page(store, "acme", None, 10) == ([], False)
    assert not await aredis.exists(KEYS.files_of("acme"))  # the index is gone, empty
    assert 0 < await aredis.ttl(dropped) <= 2 * 60  # and what it dropped goes after it
    await aredis.zadd(dropped, {"file-old": 1})  # uploaded two files' lifetimes ago and more
    await store.put("file-b", {"tenant": "acme", "filename": "b.jsonl"}, b"{}\n")
    await store.delete("file-b")
    await _page(store, "acme", None, 10)
    assert await aredis.zrange(dropped, 0, -1) == [b"file-a", b"file-b"]  # file-old pruned


async def test_a_cursor_dropped_before_the_sorted_set_keeps_its_place(
    aredis: aioredis.Redis,
) -> None:
    """Releases before kept the dropped ids' scores in a hash (never pruned, no TTL once its
    tenant had deleted all it listed): a page after an id it held keeps its place, and the key
    becomes the sorted set, with its TTL, on first use."""
    store = FileStore(aredis, KEYS, 600)
    for n in range(3):
        await store.put(f"old-{n}", {"tenant": "legacy", "filename": f"{n}.jsonl"}, b"{}\n")
        await asyncio.sleep(0.002)  # scored by the ms each was uploaded in
    index, dropped = KEYS.files_of("legacy"), KEYS.files_unlisted_of("legacy")
    score = await aredis.zscore(index, "old-1")
    await aredis.zrem(index, "old-1")  # dropped by a listing of an earlier release
    await aredis.delete(KEYS.file("old-1"))
    await aredis.hset(dropped, "old-1", str(score))
    rest, more = await _page(store, "legacy", "old-1", 5)
    assert [file_id for file_id, _ in rest] == ["old-0"] and not more
    assert await aredis.type(dropped) == b"zset" and await aredis.zscore(dropped, "old-1") == score
    await aredis.delete(KEYS.file("old-0"))
    await _page(store, "legacy", None, 5)  # drops old-0: UNLIST
    assert 0 < await aredis.ttl(dropped) <= 2 * 600


async def test_a_file_past_its_ttl_gives_its_bytes_back_to_its_tenants_budget(
    aredis: aioredis.Redis,
) -> None:
    """Files leave the budget as their keys expire, not only when deleted: a tenant whose
    uploads had all expired would stay refused."""
    store = FileStore(aredis, KEYS, 600)
    await store.hold("quota", "file-old", 8, 10)
    with pytest.raises(OverBudget):
        await store.hold("quota", "file-new", 8, 10)
    await aredis.zadd(f"{KEYS.files_of('quota')}:expiring", {"file-old": 1})  # as its TTL ran out
    await store.hold("quota", "file-new", 8, 10)
    assert await aredis.hget(f"{KEYS.files_of('quota')}:bytes", "total") == b"8"


async def test_a_deleted_file_leaves_its_tenants_index(aredis: aioredis.Redis) -> None:
    """Deleted files stayed indexed: a loop of uploads and deletes (each giving its bytes back)
    grew the index without bound, and the next listing looked up every dead entry."""
    store = FileStore(aredis, KEYS, 600)
    for n in range(300):
        await store.put(f"churn-{n}", {"tenant": "churn", "filename": "a.jsonl"}, b"{}\n")
        await store.delete(f"churn-{n}")
    assert await aredis.zcard(KEYS.files_of("churn")) == 0


async def test_a_page_past_many_gone_entries_reads_each_once_a_bounded_number_at_a_time(
    aredis: aioredis.Redis,
) -> None:
    """A page read on past gone entries until it filled, in reads that grew without bound; it
    then stopped after PAGE_ROUNDS reads, empty, `has_more` true, which ends OpenAI's clients'
    listing with the live file never listed. One that has found none reads on, at most CHUNK
    ids a read, each gone entry read (and unlisted) once."""
    store = FileStore(aredis, KEYS, 600)
    await store.put("file-live", {"tenant": "bulk", "filename": "a.jsonl"}, b"{}\n")
    index = KEYS.files_of("bulk")
    since = now_ms() - 60_000  # gone before their entries (evicted), oldest first
    await aredis.zadd(index, {f"file-gone-{n}": since + n for n in range(3000)})
    reads: list[int] = []

    async def look(file_ids: list[str]) -> list[dict[str, str] | None]:
        reads.append(len(file_ids))
        return await store.fields_many(file_ids)

    page = await store.page("bulk", None, 10, look, newest_first=False)
    assert [file_id for file_id, _ in page.found] == ["file-live"] and not page.more
    assert max(reads) <= CHUNK and sum(reads) == 3001, reads
    assert await aredis.zrange(index, 0, -1) == [b"file-live"]


async def test_a_page_after_a_deleted_file_keeps_its_place_among_those_of_its_ms(
    aredis: aioredis.Redis,
) -> None:
    """A page after an unlisted id read on from its score alone, skipping the files uploaded in
    the same ms; a delete unlists its file, so a client deleting what it lists lost them."""
    store = FileStore(aredis, KEYS, 600)
    for n in range(4):
        await store.put(f"file-{n}", {"tenant": "acme", "filename": f"{n}.jsonl"}, b"{}\n")
    await aredis.zadd(
        KEYS.files_of("acme"), dict.fromkeys(await store.listed("acme", None, 4), now_ms())
    )
    await store.delete("file-2")
    assert await store.listed("acme", "file-2", 5) == ["file-1", "file-0"]  # by id within an ms
    assert await store.listed("acme", "file-2", 5, newest_first=False) == ["file-3"]
    assert await store.listed("acme", None, 5) == ["file-3", "file-1", "file-0"]  # put back


@pytest.mark.parametrize("trimmed_by", ["nothing", "an upload", "a first page"])
async def test_a_cursor_past_a_files_lifetime_keeps_its_place(
    aredis: aioredis.Redis, trimmed_by: str
) -> None:
    """Oldest first, the file a page ended on expired before the next request: a listing that
    dropped entries past any file's lifetime before reading dropped the cursor with its score,
    so the page after it was empty and final, the newer live files never listed; so did an
    upload, or another client's first page, between the two pages."""
    store = FileStore(aredis, KEYS, 60)
    await store.put("file-new", {"tenant": "late", "filename": "b.jsonl"}, b"{}\n")
    await aredis.zadd(KEYS.files_of("late"), {"file-old": now_ms() - 61_000})  # its file gone
    if trimmed_by == "an upload":
        await store.put("file-newer", {"tenant": "late", "filename": "c.jsonl"}, b"{}\n")
    elif trimmed_by == "a first page":
        await _page(store, "late", None, 1)
    page, more = await _page(store, "late", "file-old", 5, False)
    newer = ["file-newer"] if trimmed_by == "an upload" else []
    assert [file_id for file_id, _ in page] == ["file-new", *newer] and not more
    assert await aredis.zscore(KEYS.files_of("late"), "file-old") is None  # it left the index

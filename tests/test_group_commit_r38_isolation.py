"""One bad key in a merged ENQUEUE, on a real Valkey: the submits of one event-loop turn share
one script call (group commit, `merged_enqueues`), and a key of the wrong type that only one of
them touches (its job's key, its tenant's held list in a fair lane) failed that whole call: every
caller was refused while the jobs written before the error stayed enqueued. Each job now gets its
own reply: the bad one its error, every other its admission."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from producer_api.jobs.group_commit import FLUSHES, group_committing
from shared import job_scripts
from shared.codec import RequestEntry
from shared.job_store import JobStore, NewJob, merged_enqueues, now_ms
from shared.keys import Keys, new_job_id
from workers.partition.stream_reader import StreamReader

KEYS = Keys("gc-r38:")
STREAM = KEYS.queue("m", "v")
FIELDS = {"model": "m", "variant": "v"}


def _entry(tenant: str = "default") -> RequestEntry:
    return RequestEntry(new_job_id("m", "v"), {"inputs": {}}, now_ms(), tenant=tenant)


@pytest.fixture
async def store(aredis: aioredis.Redis) -> JobStore:
    """A store on a group-committing client that merges ENQUEUE calls, as the producer's."""
    hot = group_committing(aredis, "", "hot", {job_scripts.ENQUEUE: merged_enqueues})
    store = JobStore(hot, KEYS, 60)
    await store.create(_entry(), KEYS.queue("m", "warm"), FIELDS)  # the script is loaded
    return store


async def _statuses(aredis: aioredis.Redis, entries: list[RequestEntry]) -> list[bytes | None]:
    return [await aredis.hget(KEYS.job(entry.job_id), "status") for entry in entries]


async def test_a_bad_job_key_fails_its_own_submit_only(
    aredis: aioredis.Redis, store: JobStore
) -> None:
    entries = [_entry() for _ in range(5)]
    await aredis.set(KEYS.job(entries[2].job_id), "not a hash")
    flushes = FLUSHES._value.get()
    results = await asyncio.gather(
        *(store.create(entry, STREAM, FIELDS) for entry in entries), return_exceptions=True
    )
    assert FLUSHES._value.get() - flushes == 1  # one merged call
    bad = results.pop(2)
    assert isinstance(bad, ResponseError) and "WRONGTYPE" in str(bad)
    assert results == [0, 1, 2, 3]  # their queue positions: the bad job's entry is deleted
    good = entries[:2] + entries[3:]
    assert await _statuses(aredis, good) == [b"queued"] * 4
    # the lane's counter numbers the entries written, none left over (positions read it)
    assert int(await aredis.get(KEYS.added(STREAM)) or 0) == await aredis.xlen(STREAM)


async def test_a_tenants_bad_held_list_fails_that_tenants_submit_only(
    aredis: aioredis.Redis, store: JobStore
) -> None:
    """A fair lane holds the jobs past its window in each tenant's list: one tenant's list of
    the wrong type refuses that tenant's job, not the other tenants' of the same turn."""
    await store.create(_entry("first"), STREAM, FIELDS, fair=(1, 1.0))  # fills the window
    await aredis.set(KEYS.held(STREAM, "broken"), "not a list")
    entries = [_entry("a"), _entry("broken"), _entry("b")]
    results = await asyncio.gather(
        *(store.create(entry, STREAM, FIELDS, fair=(1, 1.0)) for entry in entries),
        return_exceptions=True,
    )
    assert isinstance(results[1], ResponseError) and "WRONGTYPE" in str(results[1])
    assert not isinstance(results[0], BaseException)
    assert not isinstance(results[2], BaseException)
    assert await _statuses(aredis, entries) == [b"queued", None, b"queued"]
    assert await aredis.llen(KEYS.held(STREAM, "a")) == 1
    assert await aredis.llen(KEYS.held(STREAM, "b")) == 1


async def test_a_batch_with_a_bad_job_key_raises_that_jobs_error(
    aredis: aioredis.Redis, store: JobStore
) -> None:
    """`create_many` reads the same replies: a job that failed is no job admitted."""
    jobs = [NewJob(_entry(), STREAM, FIELDS) for _ in range(3)]
    await aredis.set(KEYS.job(jobs[1].entry.job_id), "not a hash")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await store.create_many(jobs)


async def test_a_failed_jobs_entry_leaves_the_lane_readable(
    aredis: aioredis.Redis, store: JobStore
) -> None:
    """A job whose key is of the wrong type fails at its HSET, after XADD added its entry.
    That entry, naming a job with no hash, stayed in the lane: every worker read that reached it
    failed on the key (TAKE's `claim`), the good jobs delivered in the same read left pending
    with nobody running them. The failed job's entry goes with it."""
    lane = KEYS.queue("m", "read")
    entries = [_entry() for _ in range(3)]
    await aredis.set(KEYS.job(entries[1].job_id), "not a hash")
    results = await asyncio.gather(
        *(store.create(entry, lane, FIELDS) for entry in entries), return_exceptions=True
    )
    assert isinstance(results[1], ResponseError) and "WRONGTYPE" in str(results[1])
    assert [results[0], results[2]] == [0, 1]  # no entry of the failed job ahead of the last
    assert await aredis.xlen(lane) == 2
    assert int(await aredis.get(KEYS.added(lane)) or 0) == 2  # numbers only the entries kept
    reader = StreamReader(aredis, KEYS, [lane], "review-r38")
    await reader.ensure_groups()
    taken = await reader.take([lane], 10)  # raised WRONGTYPE on the failed job's entry
    assert taken is not None
    _, deliveries = taken
    ids = [delivery.entry.job_id for delivery in deliveries if delivery.entry is not None]
    assert ids == [entries[0].job_id, entries[2].job_id]
    assert [delivery.status for delivery in deliveries] == ["queued", "queued"]

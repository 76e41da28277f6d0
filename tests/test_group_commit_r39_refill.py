"""A held job's reply when the refill after it fails, on a real Valkey: ENQUEUE holds a fair
lane's job in its tenant's list and then refills the lane, which may pop ANOTHER tenant's list.
That list of the wrong type failed the refill after the held job was written: its caller was
told the job failed (a client that retries enqueues it twice). The reply now tells the truth: the
job written is admitted; the refill's trouble is the lane's, for the next refill to meet."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from producer_api.jobs.group_commit import group_committing
from shared import job_scripts
from shared.codec import RequestEntry
from shared.job_store import JobStore, merged_enqueues, now_ms
from shared.keys import GROUP, Keys, new_job_id

KEYS = Keys("gc-r39:")
STREAM = KEYS.queue("m", "v")
FIELDS = {"model": "m", "variant": "v"}
FAIR = (1, 1.0)  # a window of one undelivered entry


def _entry(tenant: str) -> RequestEntry:
    return RequestEntry(new_job_id("m", "v"), {"inputs": {}}, now_ms(), tenant=tenant)


@pytest.fixture
async def store(aredis: aioredis.Redis) -> JobStore:
    """A store on a group-committing client that merges ENQUEUE calls, as the producer's, on a
    fair lane whose window is taken (its one entry delivered) and whose ring's first tenant
    ("broken") holds a job in a list someone overwrote with a string."""
    hot = group_committing(aredis, "", "hot", {job_scripts.ENQUEUE: merged_enqueues})
    store = JobStore(hot, KEYS, 60)
    await aredis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    await store.create(_entry("first"), STREAM, FIELDS, fair=FAIR)  # into the stream
    await store.create(_entry("broken"), STREAM, FIELDS, fair=FAIR)  # held: the window is full
    await aredis.xreadgroup(GROUP, "reader", {STREAM: ">"})  # undelivered 0: refill has room
    await aredis.set(KEYS.held(STREAM, "broken"), "not a list")
    return store


async def test_a_held_job_is_admitted_when_the_refill_after_it_fails(
    aredis: aioredis.Redis, store: JobStore
) -> None:
    entry = _entry("a")
    ahead = await store.create(entry, STREAM, FIELDS, fair=FAIR)  # raised WRONGTYPE
    assert ahead >= 0
    assert await aredis.hget(KEYS.job(entry.job_id), "status") == b"queued"
    assert await aredis.llen(KEYS.held(STREAM, "a")) == 1  # held once, for refill to move


async def test_a_merged_calls_held_jobs_each_get_their_admission(
    aredis: aioredis.Redis, store: JobStore
) -> None:
    """Every job of one merged call that was held is admitted, the refill after each failing."""
    entries = [_entry("a"), _entry("b"), _entry("a")]
    results = await asyncio.gather(
        *(store.create(entry, STREAM, FIELDS, fair=FAIR) for entry in entries),
        return_exceptions=True,
    )
    assert not any(isinstance(result, BaseException) for result in results), results
    statuses = [await aredis.hget(KEYS.job(entry.job_id), "status") for entry in entries]
    assert statuses == [b"queued"] * 3
    assert await aredis.llen(KEYS.held(STREAM, "a")) == 2
    assert await aredis.llen(KEYS.held(STREAM, "b")) == 1
    # the lane counts every job it holds (admission counts them against max_length)
    assert int(await aredis.hget(KEYS.fair(STREAM), "held") or 0) == 4

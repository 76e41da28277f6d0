"""ENQUEUE's lone failure on a real Valkey: a job whose key is of the wrong type fails at its
HSET, after XADD added its entry. That entry, naming a job with no hash, stayed in the lane:
every worker read that reached it failed on the key (TAKE's `claim`), the good jobs delivered
in the same read left pending with nobody running them. The failed job's entry goes with it."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from producer_api.jobs.group_commit import group_committing
from shared import job_scripts
from shared.codec import RequestEntry
from shared.job_store import JobStore, merged_enqueues, now_ms
from shared.keys import Keys, new_job_id
from workers.partition.stream_reader import StreamReader

KEYS = Keys("review-r38-enqueue:")
STREAM = KEYS.queue("m", "v")
FIELDS = {"model": "m", "variant": "v"}


def _entry() -> RequestEntry:
    return RequestEntry(new_job_id("m", "v"), {"inputs": {}}, now_ms())


@pytest.fixture
async def store(aredis: aioredis.Redis) -> JobStore:
    """A store on a group-committing client that merges ENQUEUE calls, as the producer's."""
    hot = group_committing(aredis, "", "hot", {job_scripts.ENQUEUE: merged_enqueues})
    store = JobStore(hot, KEYS, 60)
    await store.create(_entry(), KEYS.queue("m", "warm"), FIELDS)  # the script is loaded
    return store


async def test_a_failed_jobs_entry_leaves_the_lane_readable(
    aredis: aioredis.Redis, store: JobStore
) -> None:
    entries = [_entry() for _ in range(3)]
    await aredis.set(KEYS.job(entries[1].job_id), "not a hash")
    results = await asyncio.gather(
        *(store.create(entry, STREAM, FIELDS) for entry in entries), return_exceptions=True
    )
    assert isinstance(results[1], ResponseError) and "WRONGTYPE" in str(results[1])
    assert [results[0], results[2]] == [0, 1]  # no entry of the failed job ahead of the last
    assert await aredis.xlen(STREAM) == 2
    assert int(await aredis.get(KEYS.added(STREAM)) or 0) == 2  # numbers only the entries kept
    reader = StreamReader(aredis, KEYS, [STREAM], "review-r38")
    await reader.ensure_groups()
    taken = await reader.take([STREAM], 10)  # raised WRONGTYPE on the failed job's entry
    assert taken is not None
    _, deliveries = taken
    ids = [delivery.entry.job_id for delivery in deliveries if delivery.entry is not None]
    assert ids == [entries[0].job_id, entries[2].job_id]
    assert [delivery.status for delivery in deliveries] == ["queued", "queued"]

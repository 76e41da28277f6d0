"""Behaviours of the job scripts (shared/job_scripts.py) no other test failed without: found by
mutating each script by hand (a dropped EXPIRE, XDEL or publish, a skipped check, an off-by-one)
and keeping a test for every change that still passed. On a real Valkey, no worker process."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, NewJob, QueueFull, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, QueueLimits
from shared.queue_position import QueuePositions
from tests.lane_rig import queue_jobs
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import Delivery, StreamReader

KEYS = Keys("rm:")
TTL_S = 60
CONFIG = ModelConfig(
    name="m",
    kind="batch",
    backend="identity",
    queue=QueueLimits(visibility_timeout_s=0.05, max_deliveries=1),
)
PARTITION = Partition.of(KEYS, CONFIG, "default")
STREAM = PARTITION.online


@pytest.fixture
async def writer(aredis: aioredis.Redis) -> AsyncIterator[ResultWriter]:
    made = ResultWriter(aredis, KEYS, TTL_S, JobEvents("redis://unused"), "w-1")
    yield made
    await made.close()


async def _read(client: aioredis.Redis, consumer: str, mark: bool = False) -> list[Delivery]:
    """What one TAKE of `consumer` hands over from STREAM (`mark`: as a generate loop's)."""
    reader = StreamReader(client, KEYS, PARTITION.streams, consumer, mark_on_read=mark)
    await reader.ensure_groups()
    taken = await reader.take([STREAM], 100)
    return taken[1] if taken else []


async def _aged(client: aioredis.Redis, job_id: str) -> None:
    """`job_id` as if it had waited most of its hash's TTL in the queue: created long ago, its
    hash a few seconds from expiring."""
    await client.hset(KEYS.job(job_id), "created", now_ms() - 50_000)
    await client.expire(KEYS.job(job_id), 5)


async def test_a_take_that_marks_leaves_a_cancelled_job_cancelled(aredis: aioredis.Redis) -> None:
    """A job cancelled while its entry waited in the stream is handed over as cancelled (the
    worker acknowledges it only): a generate loop's marking read set it running, so the worker
    ran it and wrote its result over the cancel."""
    store = JobStore(aredis, KEYS, TTL_S)
    await queue_jobs(store, STREAM, "gone")
    # enqueued before job hashes named their entries: its cancel leaves the entry in the stream
    await aredis.hdel(KEYS.job("gone"), "entry")
    await store.transition("gone", JobStatus.CANCELLED)
    (delivery,) = await _read(aredis, "w-1", mark=True)
    assert delivery.status == "cancelled" and not delivery.runnable
    assert await aredis.hmget(KEYS.job("gone"), "status", "worker") == [b"cancelled", None]


async def test_a_result_of_a_job_that_waited_long_is_kept_its_full_ttl(
    aredis: aioredis.Redis, writer: ResultWriter
) -> None:
    """A job whose wait took most of its hash's TTL gets the TTL renewed with its result; else
    the result was gone seconds after the job ended."""
    store = JobStore(aredis, KEYS, TTL_S)
    await queue_jobs(store, STREAM, "slow")
    await _aged(aredis, "slow")
    (delivery,) = await _read(aredis, "w-1")
    await writer.finish(
        STREAM, [PARTITION.finish(delivery, JobStatus.SUCCEEDED, {"outputs": "{}"})]
    )
    assert await aredis.ttl(KEYS.job("slow")) > TTL_S - 10


async def test_a_cancel_of_a_job_that_waited_long_is_kept_its_full_ttl(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, TTL_S)
    await queue_jobs(store, STREAM, "waited")
    await _aged(aredis, "waited")
    await store.transition("waited", JobStatus.CANCELLED)
    assert await aredis.ttl(KEYS.job("waited")) > TTL_S - 10


async def test_a_dead_letter_ends_its_job_for_good_and_says_so(aredis: aioredis.Redis) -> None:
    """Past max_deliveries the entry leaves the stream (the lane's length, which admission
    counts, drops), the failure is published on the job's reply channel (a waiting `?wait=`
    answers at once) and the failed job is kept its full TTL, however long it waited."""
    store = JobStore(aredis, KEYS, TTL_S)
    entry = RequestEntry("doomed", {"inputs": {}}, now_ms(), reply="rm:reply:p1")
    await store.create(entry, STREAM, {"model": "m", "variant": "default"})
    await _aged(aredis, "doomed")
    await _read(aredis, "dead-1")  # then it died
    pubsub = aredis.pubsub(ignore_subscribe_messages=True)
    await pubsub.ssubscribe("rm:reply:p1")
    await asyncio.sleep(0.1)  # past the visibility timeout
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "w-1", TTL_S, JobEvents("redis://unused"))
    assert await reclaimer.reclaim(STREAM) == []  # dead-lettered, not run again

    assert await aredis.xlen(STREAM) == 0
    assert await aredis.xlen(KEYS.dlq("m", "default")) == 1
    assert await aredis.hget(KEYS.job("doomed"), "status") == b"failed"
    assert await aredis.ttl(KEYS.job("doomed")) > TTL_S - 10
    message = None
    for _ in range(50):
        if message := await pubsub.get_message(timeout=0.1):
            break
    await pubsub.aclose()
    assert message is not None and b'"DeadLettered"' in message["data"]


async def test_a_write_back_rerun_counts_its_entries_drained_once(
    aredis: aioredis.Redis, writer: ResultWriter
) -> None:
    """The drain rate (ETAs, Retry-After) counts entries acknowledged, not write-backs: a rerun
    after a lost reply counted the batch twice. Its per-second counters expire."""
    store = JobStore(aredis, KEYS, TTL_S)
    await queue_jobs(store, STREAM, "a", "b")
    first = int(time.time())
    batch = [
        PARTITION.finish(d, JobStatus.SUCCEEDED, {"outputs": "{}"})
        for d in await _read(aredis, "w-1")
    ]
    await writer.finish(STREAM, batch)
    await writer.finish(STREAM, batch)  # its reply was lost: run again
    counters = [KEYS.drained(STREAM, s) for s in range(first, int(time.time()) + 1)]
    assert sum(int(n or 0) for n in await aredis.mget(counters)) == 2
    for counter in counters:
        if await aredis.exists(counter):
            assert 0 < await aredis.ttl(counter) <= 120


def _fair(tenant: str) -> NewJob:
    """A job of `tenant` on STREAM as a fair lane of window 1 enqueues it."""
    entry = RequestEntry(uuid.uuid4().hex, {"inputs": {}}, now_ms(), tenant=tenant)
    return NewJob(entry, STREAM, {"model": "m", "variant": "default"}, 1, 1.0)


async def _create(store: JobStore, job: NewJob, max_length: int) -> int:
    return await store.create(job.entry, job.stream, job.fields, max_length, fair=(1, 1.0))


async def test_a_job_cancelled_after_round_robin_moved_it_in_is_not_uncounted_twice(
    aredis: aioredis.Redis,
) -> None:
    """A held job that refill moved into the stream is held no more: cancelled there, it left
    the lane's held count a second time, and the lane then admitted a job past max_length."""
    store = JobStore(aredis, KEYS, TTL_S)
    first, moved = _fair("a"), _fair("a")
    assert await store.create_many([first, moved]) == []  # `moved` held behind the window
    assert len(await _read(aredis, "w-1")) == 2  # the take moved it in
    await store.transition(moved.entry.job_id, JobStatus.CANCELLED)
    assert int(await aredis.hget(KEYS.fair(STREAM), "held") or 0) == 0
    with pytest.raises(QueueFull):  # both entries are still in the stream
        await _create(store, _fair("b"), max_length=2)


async def test_a_sweep_uncounts_held_jobs_whose_hashes_expired(aredis: aioredis.Redis) -> None:
    """A tenant's held list at twice max_length is swept; a held job whose hash expired left
    its entry there, counted as held, and the sweep that dropped it kept counting it: the lane
    refused jobs (429) for room it had."""
    store = JobStore(aredis, KEYS, TTL_S)
    max_length = 3
    await _create(store, _fair("a"), max_length)  # the window: in the stream
    for _ in range(5):  # held, then cancelled: uncounted, their entries left in the list
        job = _fair("a")
        await _create(store, job, max_length)
        await store.transition(job.entry.job_id, JobStatus.CANCELLED)
    expired = _fair("a")
    await _create(store, expired, max_length)
    await aredis.delete(KEYS.job(expired.entry.job_id))  # its hash expired while it was held
    await _create(store, _fair("a"), max_length)  # its list holds 6: swept first
    assert await aredis.hget(KEYS.fair(STREAM), "held") == b"1"
    await _create(store, _fair("a"), max_length)  # room for it: 1 in the stream, 1 held


async def test_a_queued_jobs_position_counts_only_the_entries_ahead_of_it(
    aredis: aioredis.Redis,
) -> None:
    """GET's position of a job in the stream: the first undelivered one stands at 0."""
    store = JobStore(aredis, KEYS, TTL_S)
    await StreamReader(aredis, KEYS, PARTITION.streams, "w-1").ensure_groups()
    await queue_jobs(store, STREAM, "p1", "p2", "p3")
    positions = QueuePositions(aredis, KEYS)
    seqs = [int(await aredis.hget(KEYS.job(job), "seq") or 0) for job in ("p1", "p2", "p3")]
    assert [await positions.position(STREAM, seq, "default") for seq in seqs] == [0, 1, 2]
    await aredis.xreadgroup(GROUP, "w-1", {STREAM: ">"}, count=1)
    assert await positions.position(STREAM, seqs[2], "default") == 1


async def test_the_consoles_read_of_held_jobs_stops_at_its_limit(aredis: aioredis.Redis) -> None:
    """HELD_IDS lists at most the ids asked for, tenant by tenant in the ring's order: the
    console's bounded read of a flood held back read every held job."""
    store = JobStore(aredis, KEYS, TTL_S)
    jobs = [_fair("a") for _ in range(4)] + [_fair("b") for _ in range(3)]
    assert await store.create_many(jobs) == []  # the first in the stream, six held
    held_ids = aredis.register_script(job_scripts.HELD_IDS)
    listed = [job_id.decode() for job_id in await held_ids(keys=[STREAM], args=[4])]
    assert listed == [job.entry.job_id for job in jobs[1:4] + jobs[4:5]]


async def test_a_new_jobs_position_leaves_out_the_entries_workers_hold(
    aredis: aioredis.Redis,
) -> None:
    """The 202's position, and the deadline admission weighed on it, count only entries no
    worker has been handed: the ones running are not ahead of a new job."""
    store = JobStore(aredis, KEYS, TTL_S)
    await queue_jobs(store, STREAM, "r1", "r2", "w1")
    await _read(aredis, "w-1")  # all three running
    entry = RequestEntry("next", {"inputs": {}}, now_ms())
    assert await store.create(entry, STREAM, {"model": "m", "variant": "default"}, 0, 0) == 0

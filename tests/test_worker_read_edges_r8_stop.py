"""A warm shutdown that lands while a micro-batch is held open for more jobs (the adaptive
batching delay): the worker finishes what it holds and reads nothing new. On a real Valkey."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.job_store import JobStore
from shared.keys import GROUP, Keys
from shared.redis_client import connect
from tests.lane_rig import abandoned_after, queue_jobs, until_blocked_in_read
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.reclaim import Reclaimer
from workers.partition.stopping import Stopping
from workers.partition.stream_reader import StreamReader

KEYS = Keys("r8stop:")
PARTITION = abandoned_after(KEYS, 60)
WORKER = "box-8-80"
LONG_MS = 600_000  # a delay and a block no test waits out: only a stop ends them


async def test_a_stop_ends_the_top_up_and_claims_back_what_its_cut_reply_handed_over(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """A stop while the micro-batch was held open left the top-up read blocking to the end of
    `max_queue_delay_ms`, reading jobs queued after the stop. Cut now, what this consumer holds
    and is not running (the cut reply's) joins the micro-batch, and what it runs stays out."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await StreamReader(aredis, KEYS, PARTITION.streams, WORKER).ensure_groups()
    await queue_jobs(store, PARTITION.online, "running", "lost")
    await aredis.xreadgroup(GROUP, WORKER, {PARTITION.online: ">"})  # one runs, one was lost
    [(_, pending)] = await aredis.xreadgroup(GROUP, WORKER, {PARTITION.online: "0"})
    in_hand = {(PARTITION.online, pending[0][0])}
    await queue_jobs(store, PARTITION.online, "new")
    patient = connect(redis_url, blocks_ms=LONG_MS)  # its socket outlasts the block
    reader = StreamReader(patient, KEYS, PARTITION.streams, WORKER)
    reader.max_block_ms = LONG_MS
    events = JobEvents("redis://unused")
    lanes = LaneScheduler(
        PARTITION, reader, Reclaimer(patient, KEYS, PARTITION, WORKER, 60, events)
    )
    lanes.arrivals[PARTITION.online].arrived(10_000)  # busy: the batch is held open
    stop = Stopping()
    reading = asyncio.create_task(lanes.next_batch(10, LONG_MS, LONG_MS, in_hand, stop=stop))

    try:
        await until_blocked_in_read(aredis)
        stop.set()
        ((stream, deliveries),) = await asyncio.wait_for(reading, 5)  # a bound, not a timing
    finally:
        await patient.aclose()

    assert stream == PARTITION.online
    assert [d.entry.job_id for d in deliveries if d.entry] == ["new", "lost"]

"""Two producers' sweepers feeding the same batch's held items at once: each item is enqueued
once (FED, ENQUEUE's `may_exist`) and is counted once in `conveyor_jobs_submitted_total`, by
the feeder that records it. Held items are written as the Batch API's create writes them; no
app, no worker."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from producer_api.batch_api.feeding import BatchFeeder
from shared.batch_api_store import BatchApiStore, HeldLane
from shared.codec import RequestEntry
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import Keys, new_job_id

KEYS = Keys("batch-life-feeding:")
TTL_S = 600
MODEL, VARIANT = "fed", "default"
HELD = 3


def _submitted() -> float:
    labels = {"model": MODEL, "variant": VARIANT, "lane": "bulk"}
    return REGISTRY.get_sample_value("conveyor_jobs_submitted_total", labels) or 0.0


async def _held_lane(store: BatchApiStore) -> HeldLane:
    """A batch's lane holding HELD items its bulk lane had no room for at create."""
    batch_id = f"batch_{uuid.uuid4().hex}"
    lane = HeldLane(
        KEYS.batch_held(batch_id, MODEL, VARIANT),
        KEYS.batch_open(batch_id, MODEL, VARIANT),
        KEYS.bulk_queue(MODEL, VARIANT),
        HELD,
        MODEL,
        VARIANT,
        0,
        1.0,
        TTL_S,
    )
    fields = {"model": MODEL, "variant": VARIANT, "batch": batch_id}
    jobs = [
        NewJob(
            RequestEntry(new_job_id(MODEL, VARIANT), {"inputs": {}}, now_ms()), lane.stream, fields
        )
        for _ in range(HELD)
    ]
    entries = [lane.entry(job) for job in jobs]
    await store.add_items(batch_id, [], [], TTL_S, [(lane.held, entries)])
    return lane


class _RacedStore(BatchApiStore):
    """The first feeder's store: right after it reads the held items, another producer's
    feeder feeds and records the same ones whole, before this one's ENQUEUE."""

    def __init__(self, client: aioredis.Redis, other: BatchFeeder) -> None:
        super().__init__(client, KEYS, TTL_S)
        self.other = other
        self.raced = False

    async def held_head(self, lane: HeldLane, count: int) -> list[bytes]:
        head = await super().held_head(lane, count)
        if not self.raced:
            self.raced = True
            await self.other.feed([lane])
        return head


async def test_items_two_feeders_enqueue_at_once_are_counted_submitted_once(
    aredis: aioredis.Redis,
) -> None:
    jobs = JobStore(aredis, KEYS, TTL_S)
    lane = await _held_lane(BatchApiStore(aredis, KEYS, TTL_S))
    other = BatchFeeder(jobs, BatchApiStore(aredis, KEYS, TTL_S))
    store = _RacedStore(aredis, other)
    before = _submitted()

    await BatchFeeder(jobs, store).feed([lane])

    assert store.raced
    assert await aredis.xlen(lane.stream) == HELD  # enqueued once
    assert await aredis.llen(lane.items) == HELD and await aredis.llen(lane.held) == 0
    assert _submitted() - before == HELD  # counted by the feeder that recorded them

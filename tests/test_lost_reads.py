"""A read that Redis served but whose reply an outage lost (a torn connection, a failover)
leaves its entries in the worker's pending list, where nobody runs them until reclaim, a
visibility timeout later. After an outage the worker's own read path (LaneScheduler,
StreamReader) runs them first, except those it still has in hand. On a real Valkey, no engine."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, QueueLimits
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import Delivery, MicroBatch, StreamReader

KEYS = Keys("lost:")
CONFIG = ModelConfig(
    name="m", kind="batch", backend="identity", queue=QueueLimits(visibility_timeout_s=60)
)
PARTITION = Partition.of(KEYS, CONFIG, "default")
WORKER = "box-5-55"


def _jobs(batches: list[MicroBatch]) -> list[str]:
    return [d.entry.job_id for _, deliveries in batches for d in deliveries if d.entry]


async def test_after_an_outage_the_entries_a_lost_read_was_handed_run_first(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    for job_id in ("a", "b", "c"):
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    events = JobEvents("redis://unused")
    lanes = LaneScheduler(PARTITION, reader, Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, events))
    writer = ResultWriter(aredis, KEYS, 60, events, WORKER)

    lost = await lanes.next_batch(10, 0, 100)  # Redis served it; its reply never arrived
    assert _jobs(lost) == ["a", "b", "c"]
    assert await lanes.next_batch(10, 0, 50) == []  # an ordinary read does not see them
    in_hand = {lost[0][1][0].entry_id}  # "a" still runs (a generation, a staged micro-batch)

    lanes.outage()
    recovered: list[Delivery] = []
    while batches := await lanes.next_batch(1, 0, 50, in_hand):
        ((stream, deliveries),) = batches
        recovered += deliveries
        await writer.finish(
            stream, [PARTITION.finish(d, JobStatus.SUCCEEDED, {}) for d in deliveries]
        )

    assert [d.entry.job_id for d in recovered if d.entry] == ["b", "c"]
    for job_id in ("b", "c"):
        record = await store.get(job_id)
        assert record is not None and record.status == JobStatus.SUCCEEDED
    # "a", still in hand, is pending as it was: its reads of the pending list counted no
    # delivery of it (three used to, and a crash then dead-lettered it before its time)
    [running] = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)
    assert running["message_id"] == lost[0][1][0].entry_id and running["times_delivered"] == 1
    # back to ordinary reads: a new job is handed over by the blocking read
    await store.create(
        RequestEntry("d", {"inputs": {}}, now_ms()), PARTITION.online, {"model": "m"}
    )
    assert _jobs(await lanes.next_batch(10, 0, 50, in_hand)) == ["d"]


async def test_a_generate_loops_recovered_jobs_are_marked_running(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry("g", {"inputs": {}}, now_ms())
    await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER, mark_on_read=True)
    await reader.ensure_groups()
    await aredis.xreadgroup(GROUP, WORKER, {PARTITION.online: ">"})  # served; reply lost

    ((_, (delivery,)),) = await reader.held(PARTITION.streams, 10, frozenset())

    assert delivery.entry is not None and delivery.entry.job_id == "g"
    assert delivery.status == JobStatus.RUNNING
    record = await store.get("g")
    assert record is not None and record.status == JobStatus.RUNNING


async def test_an_entry_another_worker_reclaims_meanwhile_is_not_taken_back(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between listing its pending entries and claiming them back, another worker may reclaim
    one (idle past the visibility timeout, after a long outage): claimed back regardless, it
    would run on both workers."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry("r", {"inputs": {}}, now_ms())
    await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    await aredis.xreadgroup(GROUP, WORKER, {PARTITION.online: ">"})  # served; reply lost
    await asyncio.sleep(0.05)
    listing = aredis.pipeline

    def reclaimed_after_listing(*args: Any, **kwargs: Any) -> Any:
        """The first pipeline (the listing) runs, then another worker reclaims the entry."""
        pipe = listing(*args, **kwargs)
        listed = pipe.execute

        async def execute(*a: Any, **k: Any) -> Any:
            rows = await listed(*a, **k)
            monkeypatch.setattr(aredis, "pipeline", listing)
            await aredis.xautoclaim(PARTITION.online, GROUP, "rescuer-7", 10, "0")
            return rows

        pipe.execute = execute
        return pipe

    monkeypatch.setattr(aredis, "pipeline", reclaimed_after_listing)
    assert await reader.held(PARTITION.streams, 10, frozenset()) == []
    [row] = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)
    assert row["consumer"] == b"rescuer-7"

"""A staged loop's wait for the device (`DeviceSchedule.until_wanted`) ends in a read, so what
ended the loop meanwhile must be seen before it: a dead engine's EngineDied (it read one more
micro-batch, left pending under a consumer about to exit, later run as a false `crashed`
attempt) and a stop (it read, ran and wrote back a fresh micro-batch after SIGTERM). On a real
Valkey."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig
from tests.conftest import until_async
from tests.fault_engine import StagedFaultEngine
from workers.batching.micro_batch_executor import Outcome
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.batching.stage_pipeline import StagePipeline
from workers.engines.base import EngineDied
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("staged-stop:")
WORKER = "box-9-98"
CONFIG = ModelConfig(
    name="m", kind="batch", backend="tests.fault_engine:StagedFaultEngine", max_batch_size=1
)
PARTITION = Partition.of(KEYS, CONFIG, "default")
SLOW = {"sleep_ms": 300}


def loaded_engine() -> StagedFaultEngine:
    engine = StagedFaultEngine(CONFIG, "default", "")
    engine.load()
    return engine


async def test_a_dead_engine_is_raised_before_the_next_read(tmp_path: Path) -> None:
    poison = tmp_path / "poisoned"
    poison.touch()
    pipeline = StagePipeline(loaded_engine())
    written: list[list[Outcome]] = []

    async def done(outcomes: list[Outcome]) -> None:
        written.append(outcomes)

    try:
        await pipeline.submit([SLOW], done)
        await pipeline.drain()  # the schedule now knows a run's time, so the next wait is real
        await pipeline.submit([SLOW], done)
        await pipeline.submit([{"while": str(poison)}], done)
        with pytest.raises(EngineDied):
            await pipeline.until_wanted()  # woken by the death it must raise
        assert len(written) == 2  # the micro-batch before the death was written back
    finally:
        pipeline.close()


async def test_a_stop_during_the_wait_for_the_device_reads_nothing_more(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    jobs = [f"job-{n}" for n in range(8)]
    for job_id in jobs:
        entry = RequestEntry(job_id, {"inputs": SLOW}, now_ms())
        await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    events = JobEvents("redis://unused")
    writer = ResultWriter(aredis, KEYS, 60, events, WORKER)
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, events)
    lanes = LaneScheduler(PARTITION, reader, reclaimer)
    loop = MicroBatchLoop(PARTITION, lanes, reader, writer, loaded_engine(), 100)
    assert loop.stages is not None
    schedule = loop.stages.schedule
    running = asyncio.create_task(loop.run())

    async def stopped_while_waiting_for_the_device() -> bool:
        """One written back and two on the schedule: the loop waits until the device wants
        more. Stopped in the same turn as that is seen, so no read of the loop's is under way."""
        first = await store.get(jobs[0])
        if first is None or first.status != JobStatus.SUCCEEDED or schedule.pending != 2:
            return False
        loop.stopping.set()
        return True

    try:
        await until_async(stopped_while_waiting_for_the_device, timeout=30, every=0.01)
        read = await entries_read(aredis)
    finally:
        loop.stopping.set()
        await asyncio.wait_for(running, 30)
        await writer.close()
    assert await entries_read(aredis) == read
    for job_id in jobs[:read]:  # what was read is finished and written back
        record = await store.get(job_id)
        assert record is not None and record.status == JobStatus.SUCCEEDED, job_id


async def entries_read(client: aioredis.Redis) -> int:
    [group] = await client.xinfo_groups(PARTITION.online)
    assert group["name"] == GROUP.encode()
    return int(group["entries-read"])

"""A staged engine's micro-batch past `queue.max_run_s` deems the engine hung: the loop's task is
cancelled, which ends it with EngineDied, and the worker exits. The loop sits in its blocking
read meanwhile (the micro-batch runs on in the stage pipeline); a cancel that a Redis call
turned into a Redis timeout (asyncio.timeout's race with an outer cancel in Python 3.11) was
taken for an outage, and the loop served on for good with its engine hung. On a real Valkey."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig, QueueLimits
from tests.fault_engine import StagedFaultEngine
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.base import EngineDied
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import MicroBatch, StreamReader

KEYS = Keys("hung-lost:")
WORKER = "box-7-77"
CONFIG = ModelConfig(
    name="m",
    kind="batch",
    backend="tests.fault_engine:StagedFaultEngine",
    max_batch_size=1,
    queue=QueueLimits(max_run_s=0.2),  # in code, under config.yaml's 1 s floor: a cheap test
)
PARTITION = Partition.of(KEYS, CONFIG, "default")
RUN_MS = 600  # the micro-batch's device stage: past max_run_s, then it ends (no thread left)


class CancelLost(StreamReader):
    """A reader whose reads after the first block until cancelled, then raise a Redis timeout
    instead: the cancel a Redis call can lose."""

    reads = 0

    async def wait(
        self, streams: Sequence[str], count: int, block_ms: int | None
    ) -> list[MicroBatch]:
        self.reads += 1
        if self.reads == 1:
            return await super().wait(streams, count, block_ms)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise RedisTimeoutError("Timeout reading from the server") from None
        return []


async def test_a_hung_engine_ends_the_loop_though_its_cancel_was_lost(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    entry = RequestEntry("job-1", {"inputs": {"sleep_ms": RUN_MS}}, now_ms())
    await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    reader = CancelLost(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    events = JobEvents("redis://unused")
    writer = ResultWriter(aredis, KEYS, 60, events, WORKER)
    engine = StagedFaultEngine(CONFIG, "default", "")
    engine.load()
    lanes = LaneScheduler(PARTITION, reader, Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, events))
    loop = MicroBatchLoop(PARTITION, lanes, reader, writer, engine, 100)
    serving = asyncio.create_task(loop.run())
    try:
        # before the fix it served on, its read after the lost cancel waiting for good
        with pytest.raises(EngineDied, match="max_run_s"):
            await asyncio.wait_for(asyncio.shield(serving), 5)
        assert reader.reads >= 2  # the cancel met the read, not the engine's stage
    finally:
        loop.stopping.set()
        serving.cancel()
        assert loop.stages is not None
        await asyncio.gather(serving, *loop.stages.in_flight, return_exceptions=True)
        await writer.close()

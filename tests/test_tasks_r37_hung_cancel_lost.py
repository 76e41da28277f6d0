"""A staged engine's micro-batch past `queue.max_run_s` deems the engine hung: the loop's task is
cancelled, which ends it with EngineDied, and the worker exits. The loop sits in its blocking
read meanwhile (the micro-batch runs on in the stage pipeline); a cancel that a Redis call
turned into a Redis timeout (asyncio.timeout's race with an outer cancel in Python 3.11) was
taken for an outage, and the loop served on for good with its engine hung. The client raises
such an error as the cancel it is (shared/redis_client.py). On a real Valkey."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig, QueueLimits
from tests.fault_engine import cancel_losing_client, staged_loop
from workers.engines.base import EngineDied
from workers.partition.partition import Partition
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
    """A reader (on a client whose connections lose a cancel: `cancel_losing_client`) whose
    reads after the first block until cancelled: the cancel lands in the read, lost there."""

    reads = 0

    async def wait(
        self, streams: Sequence[str], count: int, block_ms: int | None
    ) -> list[MicroBatch]:
        self.reads += 1
        return await super().wait(streams, count, block_ms if self.reads == 1 else 60_000)


async def test_a_hung_engine_ends_the_loop_though_its_cancel_was_lost(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    store = JobStore(aredis, KEYS, 60)
    entry = RequestEntry("job-1", {"inputs": {"sleep_ms": RUN_MS}}, now_ms())
    await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    async with cancel_losing_client(redis_url) as losing:
        loop = await staged_loop(aredis, KEYS, CONFIG, WORKER, CancelLost, reader_client=losing)
        reader = loop.reader
        assert isinstance(reader, CancelLost)
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
            await loop.writer.close()

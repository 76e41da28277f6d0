"""A staged engine's `queue.max_run_s` bounds the engine and the wait for the device, not a wait
for Redis: with writes refused (out of memory, replicas missing) the micro-batches on the device
keep their pipeline slots while their write-backs retry, and the next one waited for a slot with
its time limit running. Past it the worker exited as hung and threw the finished results away,
again after every restart for as long as the outage lasted. On a real Valkey."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig, QueueLimits
from tests.fault_engine import staged_loop
from workers.partition.finish import Finish
from workers.partition.partition import Partition
from workers.partition.result_writer import ResultWriter

KEYS = Keys("staged-oom:")
WORKER = "box-9-99"
CONFIG = ModelConfig(
    name="m",
    kind="batch",
    backend="tests.fault_engine:StagedFaultEngine",
    max_batch_size=1,
    queue=QueueLimits(max_run_s=1.0),
)
PARTITION = Partition.of(KEYS, CONFIG, "default")


class RefusingWriter(ResultWriter):
    """Write-backs Redis refuses (maxmemory reached) until `refusing` is cleared."""

    refusing = True

    async def finish(self, stream: str, batch: list[Finish]) -> list[Finish]:
        if self.refusing:
            raise OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
        return await super().finish(stream, batch)


async def test_a_wait_for_a_pipeline_slot_is_not_engine_time(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, 60)
    jobs = [f"job-{n}" for n in range(3)]
    for job_id in jobs:
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    loop = await staged_loop(aredis, KEYS, CONFIG, WORKER, writer=RefusingWriter)
    writer = loop.writer
    assert isinstance(writer, RefusingWriter)
    [(stream, deliveries)] = await loop.reader.wait([PARTITION.online], 3, None)

    # two micro-batches fill the pipeline's slots and retry their write-backs; the third waits
    running = [asyncio.create_task(loop.process(stream, [d])) for d in deliveries]
    await asyncio.sleep(2 * CONFIG.queue.max_run_s)
    assert loop.hung is None
    writer.refusing = False
    await asyncio.wait_for(asyncio.gather(*running), 60)
    assert loop.stages is not None
    await asyncio.wait_for(loop.stages.drain(), 60)
    loop.stages.close()
    await writer.close()
    for job_id in jobs:
        record = await store.get(job_id)
        assert record is not None and record.status == JobStatus.SUCCEEDED, job_id
    assert loop.hung is None

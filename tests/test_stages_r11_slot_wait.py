"""A staged micro-batch read while Redis refused writes waited for a pipeline slot; a stop then
ended the write-backs holding the slots (Redis still refusing), and the slot they freed let it
run on the engine past the stop, its results refused in turn and its jobs run again by whoever
reclaimed them. What ends the loop (that stop, an engine that died) is now raised once the
slot is taken, and the micro-batch is left pending untouched. On a real Valkey."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig
from tests.conftest import until_async
from tests.fault_engine import StagedFaultEngine
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.base import EngineDied
from workers.partition.finish import Finish
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.redis_backoff import Stopped
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("r11-slot:")
WORKER = "box-9-97"
CONFIG = ModelConfig(
    name="m", kind="batch", backend="tests.test_stages_r11_slot_wait:Counted", max_batch_size=1
)
PARTITION = Partition.of(KEYS, CONFIG, "default")


class Counted(StagedFaultEngine):
    """The fault engine, its device stage keeping the jobs it ran."""

    def load(self) -> None:
        super().load()
        self.ran: list[str] = []

    def run(self, prepared: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.ran.extend(item["job"] for item in prepared)
        return super().run(prepared)


class RefusingWriter(ResultWriter):
    """Every write-back refused, as by a Redis past its maxmemory."""

    async def finish(self, stream: str, batch: list[Finish]) -> list[Finish]:
        raise OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")


async def _loop(
    client: aioredis.Redis, keys: Keys, config: ModelConfig, writing: type[ResultWriter]
) -> tuple[MicroBatchLoop, StreamReader, ResultWriter, Counted]:
    """A staged micro-batch loop of `config`'s default variant, writing back with `writing`."""
    partition = Partition.of(keys, config, "default")
    reader = StreamReader(client, keys, partition.streams, WORKER)
    await reader.ensure_groups()
    events = JobEvents("redis://unused")
    writer = writing(client, keys, 60, events, WORKER)
    engine = Counted(config, "default", "")
    engine.load()
    lanes = LaneScheduler(partition, reader, Reclaimer(client, keys, partition, WORKER, 60, events))
    return MicroBatchLoop(partition, lanes, reader, writer, engine, 100), reader, writer, engine


async def test_a_stop_hands_back_the_micro_batch_waiting_for_a_slot(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    jobs = [f"job-{n}" for n in range(3)]
    for job_id in jobs:
        entry = RequestEntry(job_id, {"inputs": {"job": job_id}}, now_ms())
        await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    loop, reader, writer, engine = await _loop(aredis, KEYS, CONFIG, RefusingWriter)
    assert loop.stages is not None
    [(stream, deliveries)] = await reader.wait([PARTITION.online], 3, None)

    async def ran_two() -> bool:
        return len(engine.ran) == 2

    try:
        # two micro-batches take the slots and retry their write-backs; the third waits
        running = [asyncio.create_task(loop.process(stream, [d])) for d in deliveries]
        await asyncio.wait_for(asyncio.gather(*running[:2]), 5)
        await until_async(ran_two, timeout=5, every=0.01)
        loop.stopping.set()  # SIGTERM, Redis still refusing writes
        with pytest.raises(Stopped):
            await asyncio.wait_for(running[2], 5)
        with pytest.raises(Stopped):
            await asyncio.wait_for(loop.stages.drain(), 5)
    finally:
        loop.stages.close()
        await writer.close()
    assert engine.ran == jobs[:2]  # the third never reached the engine
    [group] = await aredis.xinfo_groups(PARTITION.online)
    assert group["name"] == GROUP.encode() and group["pending"] == 3  # all left for reclaim
    for job_id in jobs:
        record = await store.get(job_id)
        assert record is not None and record.status != JobStatus.SUCCEEDED, job_id


async def test_a_micro_batch_whose_engine_died_is_watched_no_more(
    aredis: aioredis.Redis, tmp_path: Path
) -> None:
    """A staged micro-batch that failed in the background (its engine died) never reached the
    write-back that ends its watch: its entries were re-claimed while the worker lived, and its
    `max_run_s` ran out later, deeming the loop hung (cutting short another's write-back)."""
    config = ModelConfig.model_validate(
        {**CONFIG.model_dump(exclude_unset=True), "queue": {"max_run_s": 0.3}}
    )
    keys = Keys("r11-died:")
    partition = Partition.of(keys, config, "default")
    store = JobStore(aredis, keys, 60)
    (tmp_path / "poisoned").touch()  # the fault engine's device dies on an item naming a file
    entry = RequestEntry("dies", {"inputs": {"while": str(tmp_path / "poisoned")}}, now_ms())
    await store.create(entry, partition.online, {"model": "m", "variant": "default"})
    loop, reader, writer, _ = await _loop(aredis, keys, config, ResultWriter)
    assert loop.stages is not None
    [(stream, deliveries)] = await reader.wait([partition.online], 1, None)
    try:
        await loop.process(stream, deliveries)
        with pytest.raises(EngineDied):
            await asyncio.wait_for(loop.stages.drain(), 5)
        await asyncio.sleep(0.5)  # past its max_run_s
    finally:
        loop.stages.close()
        await writer.close()
    assert loop.hung is None, loop.hung

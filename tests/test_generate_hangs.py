"""A generate engine that hangs (vLLM's engine core wedged, the process alive, `dead()` false)
ends its loop as a dead one does, once no generation stepped or ended for `queue.max_run_s`:
its loop re-claimed the running entries for as long as the worker lived, so nothing was
reclaimed, new jobs were admitted into the hung engine and their streams never ended. On a
real Valkey with the paced test engine and no worker process."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, QueueLimits
from tests.paced_engine import PacedEngine
from workers.engines.base import EngineDied
from workers.generation.generate_loop import GenerateLoop
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader
from workers.partition.token_writer import TokenWriter

KEYS = Keys("genhang:")
CONFIG = ModelConfig(
    name="m",
    kind="generate",
    backend="tests.paced_engine:PacedEngine",
    parameters={"step_ms": 3_600_000},  # a step an hour: a wedged engine core
    queue=QueueLimits(visibility_timeout_s=1, max_run_s=0.5),
)
PARTITION = Partition.of(KEYS, CONFIG, "default")
WORKER = "box-8-88"


async def test_a_hung_engine_hands_its_jobs_back_and_ends_the_loop(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    entry = RequestEntry("stuck", {"inputs": {"prompt": "an answer"}}, now_ms())
    await store.create(entry, PARTITION.online, {"model": "m"})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER, mark_on_read=True)
    await reader.ensure_groups()
    events = JobEvents("redis://unused")
    engine = PacedEngine(CONFIG, "default", "")
    await engine.load()
    loop = GenerateLoop(
        PARTITION,
        LaneScheduler(PARTITION, reader, Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, events)),
        reader,
        ResultWriter(aredis, KEYS, 60, events, WORKER),
        TokenWriter(aredis, KEYS, 60),
        engine,
        block_ms=50,
        drain_s=1,
    )

    with pytest.raises(EngineDied, match=r"queue\.max_run_s"):
        await asyncio.wait_for(loop.run(), 60)  # a hang guard: it ran on for ever

    [pending] = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)
    assert pending["consumer"] == WORKER.encode() and pending["times_delivered"] == 1
    record = await store.get("stuck")
    assert record is not None and record.status == JobStatus.RUNNING  # no result: rerun elsewhere
    assert not engine.dead() and not loop.running

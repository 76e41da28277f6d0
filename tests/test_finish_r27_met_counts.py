"""A micro-batch's jobs the API ended while they ran, on a real Valkey with the real micro-batch
loop, writer and identity engine (no worker process). FINISH writes no result for them and says
the end it met (`Finish.met`): a cancel, a Batch API batch's expiry, a hash gone meanwhile
(`cancelled`, as the generate loop reads it). The loop counted them in no finished state; each
now counts once, in the state FINISH met, and none is a variant statistics sample."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from shared.job_states import JobStatus
from shared.job_store import JobStore
from shared.keys import Keys
from shared.model_repository import ModelConfig
from shared.variant_stats import VariantStats
from tests.lane_rig import queue_jobs
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.identity_engine import IdentityEngine
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("r27-met:")
WORKER = "box-27-met"
CONFIG = ModelConfig(name="m", kind="batch", backend="identity")
PARTITION = Partition.of(KEYS, CONFIG, "default")
STATES = ("succeeded", "cancelled", "expired", "failed")


class HeldIdentity(IdentityEngine):
    """The identity engine, run in a thread, that holds its micro-batch until released: the
    API ends jobs while it runs."""

    inline = False

    def load(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.started.set()
        assert self.release.wait(10)
        return inputs


def _finished(state: str) -> float:
    labels = {"model": "m", "variant": "default", "state": state}
    return REGISTRY.get_sample_value("conveyor_jobs_finished_total", labels) or 0.0


async def test_jobs_the_api_ended_while_their_micro_batch_ran_count_once(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    await queue_jobs(store, PARTITION.online, "ran", "cancelled", "expired", "gone")
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    events = JobEvents("redis://unused")
    writer = ResultWriter(aredis, KEYS, 60, events, WORKER)
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, events)
    engine = HeldIdentity(CONFIG, "default", "")
    engine.load()
    scheduler = LaneScheduler(PARTITION, reader, reclaimer)
    loop = MicroBatchLoop(PARTITION, scheduler, reader, writer, engine, 100)
    before = {state: _finished(state) for state in STATES}
    since = time.time() - 60

    batch = await reader.take([PARTITION.online], 10)
    assert batch is not None and len(batch[1]) == 4
    running = asyncio.create_task(loop.process(*batch))
    assert await asyncio.to_thread(engine.started.wait, 10)
    await store.transition("cancelled", JobStatus.CANCELLED)  # DELETE /v1/jobs/{id}
    assert await store.settle_many(["expired"], JobStatus.EXPIRED, {}) == 1  # its batch's end
    await aredis.delete(KEYS.job("gone"))  # its hash expired or was deleted meanwhile
    engine.release.set()
    await running
    await writer.close()

    after = {state: _finished(state) - count for state, count in before.items()}
    # was: {"succeeded": 1, "cancelled": 0, "expired": 0, "failed": 0}
    assert after == {"succeeded": 1, "cancelled": 2, "expired": 1, "failed": 0}
    records = [await store.get(job_id) for job_id in ("cancelled", "expired", "gone")]
    statuses = [record.status if record else None for record in records]
    assert statuses == [JobStatus.CANCELLED, JobStatus.EXPIRED, None]  # as the API left them
    window = (await VariantStats(aredis, KEYS).window("m", ["default"], since))["default"]
    assert (window.requests, window.errors) == (1, 0)  # the API's ends are no samples

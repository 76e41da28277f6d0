"""A variant's own `max_batch_size` (a GPU variant batches many times what a CPU one does): the
config accepts preferred sizes up to it, fair queuing's window follows it, and the worker's
micro-batches of that variant stop at it, on a real Valkey with the worker's own loop."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig, QueueLimits, Variant
from shared.redis_client import preload
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.identity_engine import IdentityEngine
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("vb:")
WORKER = "worker-vb"


def _config(**fields: object) -> ModelConfig:
    fields.setdefault("variants", {"default": Variant(), "small": Variant(max_batch_size=3)})
    return ModelConfig(name="m", kind="batch", backend="identity", max_batch_size=64, **fields)


def test_a_variant_batches_by_its_own_maximum_or_else_the_models() -> None:
    config = _config(queue=QueueLimits(fair=True))
    assert [config.max_batch_size_of(v) for v in ("default", "small")] == [64, 3]
    assert [config.fair_window_of(v) for v in ("default", "small")] == [64, 3]
    with pytest.raises(ValueError, match=r"variant small: .*1..max_batch_size \(3\)"):
        _config(
            variants={
                "default": Variant(),
                "small": Variant(max_batch_size=3, preferred_batch_sizes=[4]),
            }
        )
    big = Variant(max_batch_size=256, preferred_batch_sizes=[128, 256])
    assert _config(variants={"default": Variant(), "gpu": big}).preferred_batch_sizes_of("gpu") == [
        128,
        256,
    ]


async def _loop(
    client: aioredis.Redis, config: ModelConfig, variant: str
) -> tuple[MicroBatchLoop, ResultWriter]:
    """The worker's loop for one partition, built as ConsumerRuntime builds it."""
    partition = Partition.of(KEYS, config, variant)
    events = JobEvents("redis://unused")
    reader = StreamReader(client, KEYS, list(partition.streams), WORKER)
    await reader.ensure_groups()
    reclaimer = Reclaimer(client, KEYS, partition, WORKER, 60, events)
    writer = ResultWriter(client, KEYS, 60, events, WORKER)
    engine = IdentityEngine(config, variant, "")
    lanes = LaneScheduler(partition, reader, reclaimer)
    return MicroBatchLoop(partition, lanes, reader, writer, engine, 100), writer


async def test_the_worker_cuts_a_variants_micro_batches_at_its_own_maximum(
    aredis: aioredis.Redis,
) -> None:
    config = _config(max_queue_delay_ms=0.0)
    await preload(aredis, job_scripts.ALL)
    store = JobStore(aredis, KEYS, ttl_s=60)
    for variant in ("small", "default"):
        for n in range(7):
            entry = RequestEntry(f"{variant}-{n}", {"inputs": {"n": n}}, now_ms())
            fields: dict[str, str | int] = {"model": "m", "variant": variant}
            await store.create(entry, KEYS.queue("m", variant), fields)
    for variant, sizes in (("small", [3, 3, 1]), ("default", [7])):
        loop, writer = await _loop(aredis, config, variant)
        for size in sizes:
            await loop.step()
            done = [await store.get(f"{variant}-{n}") for n in range(7)]
            finished = [job for job in done if job and job.fields["status"] == "succeeded"]
            assert {job.fields["batch_size"] for job in finished[-size:]} == {str(size)}
        assert len(finished) == 7
        await writer.close()

"""`conveyor_e2e_latency_seconds` takes a job's end on the worker's clock less its submit on the
producer's: with the producer's clock ahead of the worker's, a quick job read a negative
latency, and the histogram's `_sum` went down, which `rate()` reads as a counter reset."""

from __future__ import annotations

import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.identity_engine import IdentityEngine
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("metrics-r12-skew:")
AHEAD_MS = 5_000  # the producer's clock ahead of the worker's
E2E = {"model": "skewed", "variant": "default", "lane": "online"}


def _e2e(suffix: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"conveyor_e2e_latency_seconds{suffix}", E2E | labels) or 0.0


async def test_a_producer_clock_ahead_never_takes_from_the_latency_sum(
    aredis: aioredis.Redis,
) -> None:
    config = ModelConfig(name="skewed", kind="batch", backend="identity")
    partition = Partition.of(KEYS, config, "default")
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry("skewed-1", {"inputs": {}}, now_ms() + AHEAD_MS)
    await store.create(entry, partition.online, {"model": "skewed", "variant": "default"})
    reader = StreamReader(aredis, KEYS, partition.streams, "w-1")
    await reader.ensure_groups()
    events = JobEvents("redis://unused")
    writer = ResultWriter(aredis, KEYS, 60, events, "w-1")
    reclaimer = Reclaimer(aredis, KEYS, partition, "w-1", 60, events)
    engine = IdentityEngine(config, "default", "")
    loop = MicroBatchLoop(
        partition, LaneScheduler(partition, reader, reclaimer), reader, writer, engine, 100
    )
    total, count = _e2e("_sum"), _e2e("_count")

    batch = await reader.take([partition.online], 10)
    assert batch is not None
    await loop.process(*batch)
    await writer.close()

    assert _e2e("_count") == count + 1
    assert _e2e("_sum") >= total  # it was total - 5 s: a reset to rate()

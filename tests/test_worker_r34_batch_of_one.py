"""A model with `max_batch_size: 1` (a Triton model that does not batch), on a real Valkey with
the worker's own loop and identity engine: every read fills its micro-batch of one, which was
taken for a backlog, so after each lone job a TAKE found nothing before the blocking read (two
read round trips a job on an idle partition). Both lanes' jobs in one read still mean a backlog,
served by `bulk_share`."""

from __future__ import annotations

from collections import Counter

import redis.asyncio as aioredis

from shared.job_store import JobStore
from shared.keys import Keys
from shared.model_repository import ModelConfig
from tests.lane_rig import queue_jobs
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.identity_engine import IdentityEngine
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("r34-one:")
WORKER = "box-34-one"
CONFIG = ModelConfig(name="m", kind="batch", backend="identity", max_batch_size=1, bulk_share=0.5)
PARTITION = Partition.of(KEYS, CONFIG, "default")


async def _lanes(aredis: aioredis.Redis) -> tuple[LaneScheduler, StreamReader]:
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, JobEvents("redis://unused"))
    return LaneScheduler(PARTITION, reader, reclaimer), reader


async def _calls(aredis: aioredis.Redis) -> Counter[str]:
    """Commands the server ran since its last CONFIG RESETSTAT (a script's own count too)."""
    stats = await aredis.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()})


async def test_a_lone_job_costs_one_read_and_its_write_back(aredis: aioredis.Redis) -> None:
    lanes, reader = await _lanes(aredis)
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), WORKER)
    engine = IdentityEngine(CONFIG, "default", "")
    engine.load()
    loop = MicroBatchLoop(PARTITION, lanes, reader, writer, engine, block_ms=20)
    store = JobStore(aredis, KEYS, ttl_s=60)
    await queue_jobs(store, PARTITION.online, "warm")
    for _ in range(2):  # the reclaim pass due at start, scripts loaded, an empty read
        await loop.step()
    await queue_jobs(store, PARTITION.online, "lone")
    await aredis.config_resetstat()

    await loop.step()  # the lone job, read, run and written back
    await loop.step()  # idle again: straight to the blocking read
    calls = await _calls(aredis)
    await writer.close()

    assert await aredis.hget(KEYS.job("lone"), "status") == b"succeeded"
    # FINISH and two blocking reads; was (2, 4): an empty TAKE (a script reading both lanes)
    # before the second blocking read
    assert (calls["evalsha"], calls["xreadgroup"]) == (1, 2)


async def test_both_lanes_of_one_read_are_then_served_by_bulk_share(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    await queue_jobs(store, PARTITION.online, *(f"o{n}" for n in range(4)))
    await queue_jobs(store, PARTITION.bulk, *(f"b{n}" for n in range(4)))
    lanes, _ = await _lanes(aredis)

    served = [b[0] for _ in range(5) for b in await lanes.next_batch(1, 0, 20)]

    bulk, online = PARTITION.bulk, PARTITION.online
    # the blocking read hands over one of each; then TAKE, a bulk turn each two online ones
    assert served == [online, bulk, online, online, bulk, online]

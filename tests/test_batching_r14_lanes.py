"""The lane scheduler's micro-batches as a Triton dynamic-batching user expects them, on a real
Valkey with the worker's own read path (no engine): a read that hands over both lanes' jobs
holds them open for more no longer than `max_queue_delay_ms` in all, and jobs read after a long
idle are served at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import redis.asyncio as aioredis

from shared.job_store import JobStore
from shared.keys import Keys
from shared.model_repository import ModelConfig
from tests.lane_rig import queue_jobs
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.stream_reader import MicroBatch, StreamReader

KEYS = Keys("r14lanes:")
WORKER = "box-14-1"
CONFIG = ModelConfig(name="m", kind="batch", backend="identity")
PARTITION = Partition.of(KEYS, CONFIG, "default")


class CountingReader(StreamReader):
    """The worker's reader, noting how long each of its reads was allowed to block."""

    def __init__(self, client: aioredis.Redis) -> None:
        super().__init__(client, KEYS, PARTITION.streams, WORKER)
        self.blocks: list[int | None] = []

    async def wait(
        self, streams: Sequence[str], count: int, block_ms: int | None
    ) -> list[MicroBatch]:
        self.blocks.append(block_ms)
        return await super().wait(streams, count, block_ms)


async def _lanes(aredis: aioredis.Redis) -> tuple[LaneScheduler, CountingReader]:
    reader = CountingReader(aredis)
    await reader.ensure_groups()
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, JobEvents("redis://unused"))
    return LaneScheduler(PARTITION, reader, reclaimer), reader


async def test_both_lanes_of_one_read_gather_within_one_max_queue_delay(
    aredis: aioredis.Redis,
) -> None:
    """Each micro-batch of a read of both lanes was topped up for a whole `max_queue_delay_ms`
    of its own, one after the other: the online job, which runs first, waited twice the delay
    (and a worker's blocks of up to a second each, where the delay is longer), on bulk
    arrivals."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await queue_jobs(store, PARTITION.online, "online")
    await queue_jobs(store, PARTITION.bulk, "bulk")
    lanes, reader = await _lanes(aredis)
    for lane in PARTITION.streams:  # steady traffic on both until now: more jobs expected
        lanes.arrivals[lane].arrived(1_000)
    delay_ms = 100

    batches = await lanes.next_batch(8, delay_ms, 50)

    assert [stream for stream, _ in batches] == list(PARTITION.streams)
    first_read, *top_ups = reader.blocks
    assert first_read == 50 and top_ups  # the online micro-batch was held open
    assert sum(block or 0 for block in top_ups) <= delay_ms


@pytest.mark.parametrize(("jobs", "delay_ms"), [(1, 2_000), (8, 500)])
async def test_jobs_after_a_long_idle_are_served_at_once(
    aredis: aioredis.Redis, settings_env: Callable[..., None], jobs: int, delay_ms: int
) -> None:
    """The first read's own jobs counted as arrivals before the top-up asked whether more were
    coming: a lone job (or a burst) on an idle partition made the rate that expected another,
    and waited for it, with a `max_queue_delay_ms` of a second or two (a burst's: less)."""
    settings_env(CONVEYOR_BLOCK_MS="50")  # a top-up read blocks this long at most
    await queue_jobs(
        JobStore(aredis, KEYS, ttl_s=60), PARTITION.online, *(f"j{n}" for n in range(jobs))
    )
    lanes, reader = await _lanes(aredis)

    [(_, deliveries)] = await lanes.next_batch(32, delay_ms, 50)

    assert len(deliveries) == jobs
    assert reader.blocks == [50]  # the blocking read, and no top-up after it
    assert lanes.arrivals[PARTITION.online].overall() > 0  # still counted, once served

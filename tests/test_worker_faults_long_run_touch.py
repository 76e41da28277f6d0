"""A long micro-batch's entries are touched (re-claimed) every third of the visibility timeout.
A touch an outage failed waited a whole third more: through an outage as long as the timeout,
the entries stayed untouched up to a third of it after Redis was back, and another worker's
reclaimer took over a micro-batch still running here (run twice, a false `crashed` attempt on
each job, a delivery counted). It is tried again soon instead, as a generate loop's is. And a
micro-batch held open long for more jobs (a `max_queue_delay_ms` near the visibility timeout,
which the config allows) had its first touch a third of the timeout after the loop got it, its
oldest entry, untouched through the gather too, idle past the timeout meanwhile. On a real
Valkey; the watch's sleeps are recorded, not slept."""

from __future__ import annotations

import asyncio
import dataclasses
import types
from collections.abc import Callable, Sequence

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.job_store import JobStore
from shared.keys import Keys
from tests.conftest import until_async
from tests.fault_engine import cancel_losing_client
from tests.lane_rig import abandoned_after, queue_jobs
from workers.batching import long_run
from workers.batching.long_run import LongRun
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.reclaim import Reclaimer
from workers.partition.stream_reader import MicroBatch, StreamReader

KEYS = Keys("long-touch:")
WORKER = "box-3-33"
PARTITION = abandoned_after(KEYS, 60)  # a touch every 20 s
GATHERED_S = 45.0  # max_queue_delay_ms may be up to the visibility timeout


class OutageOnce(StreamReader):
    """A reader whose first touch meets an outage (Redis unreachable), as a worker's may."""

    touches = 0

    async def touch(self, stream: str, entry_ids: Sequence[bytes | str]) -> list[str]:
        self.touches += 1
        if self.touches == 1:
            raise RedisConnectionError("Error 111 connecting to Redis. Connection refused.")
        return await super().touch(stream, entry_ids)


class CancelLost(StreamReader):
    """A reader (on a client whose connections lose a cancel: `cancel_losing_client`) whose
    first touch waits in a Redis call until cancelled (a BLPOP of a list nobody fills): the
    cancel lands there, lost (asyncio.timeout's race with an outer cancel in Python 3.11). Its
    later touches return at once, so a watch that ran on still ends with the test's loop."""

    touches = 0

    async def touch(self, stream: str, entry_ids: Sequence[bytes | str]) -> list[str]:
        self.touches += 1
        if self.touches == 1:
            await self.redis.blpop([f"{stream}:unfilled"], 60)
        return []


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The watch's sleeps, recorded and not slept."""
    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        recorded.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(
        long_run, "asyncio", types.SimpleNamespace(**{**vars(asyncio), "sleep": sleep})
    )
    return recorded


async def _read(aredis: aioredis.Redis, reader: StreamReader, job_id: str) -> MicroBatch:
    """A micro-batch of job `job_id`, read by `reader` as a worker's loop reads it."""
    await queue_jobs(JobStore(aredis, KEYS, ttl_s=60), PARTITION.online, job_id)
    await reader.ensure_groups()
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, JobEvents("redis://unused"))
    [batch] = await LaneScheduler(PARTITION, reader, reclaimer).next_batch(1, 0, 50)
    return batch


async def _watched(watch: LongRun, done: Callable[[], bool]) -> None:
    async def ready() -> bool:
        return done()

    try:
        await until_async(ready, timeout=5, every=0.01)
    finally:
        watch.end()


async def test_a_touch_an_outage_failed_is_tried_again_soon(
    aredis: aioredis.Redis, pauses: list[float]
) -> None:
    reader = OutageOnce(aredis, KEYS, PARTITION.streams, WORKER)
    stream, batch = await _read(aredis, reader, "long")
    watch = LongRun(reader, stream, batch, batch, PARTITION.touch_every_s, 0, lambda: None)
    await _watched(watch, lambda: reader.touches >= 2 and len(pauses) >= 3)
    every_s = PARTITION.touch_every_s
    # after the mark a period; after the failed touch much less; touched again, a period
    assert pauses[:3] == [every_s, long_run.TOUCH_RETRY_S, every_s], pauses


async def test_the_first_touch_comes_before_a_long_gathers_entries_go_idle(
    aredis: aioredis.Redis, pauses: list[float]
) -> None:
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    stream, batch = await _read(aredis, reader, "gathered")
    # read as the micro-batch's first job, GATHERED_S before the gather ended
    gathered = [
        dataclasses.replace(d, claimed_ms=d.claimed_ms - int(GATHERED_S * 1000)) for d in batch
    ]
    watch = LongRun(reader, stream, gathered, gathered, PARTITION.touch_every_s, 0, lambda: None)
    await _watched(watch, lambda: len(pauses) >= 2)
    # idle from its read to its first touch: the gather, the mark's wait, then the first pause
    idle_s = GATHERED_S + long_run.RUNNING_MARK_S + pauses[0]
    assert idle_s < 60 - PARTITION.touch_every_s / 2, pauses
    assert pauses[1] == PARTITION.touch_every_s  # then a touch a period, as ever


async def test_an_ended_watch_stops_though_its_cancel_was_lost(
    aredis: aioredis.Redis, redis_url: str, pauses: list[float]
) -> None:
    """It touched its micro-batch's acknowledged entries every period, for good."""
    async with cancel_losing_client(redis_url) as losing:
        reader = CancelLost(losing, KEYS, PARTITION.streams, WORKER)
        stream, batch = await _read(aredis, reader, "ended")
        watch = LongRun(reader, stream, batch, batch, PARTITION.touch_every_s, 0, lambda: None)
        await _watched(watch, lambda: reader.touches == 1)
        for _ in range(20):  # the watch's sleeps are recorded, not slept: it would touch at once
            await asyncio.sleep(0)
        assert reader.touches == 1, pauses

"""A long micro-batch's entries are touched (re-claimed) every third of the visibility timeout.
A touch an outage failed waited a whole third more: through an outage as long as the timeout,
the entries stayed untouched up to a third of it after Redis was back, and another worker's
reclaimer took over a micro-batch still running here (run twice, a false `crashed` attempt on
each job, a delivery counted). It is tried again soon instead, as a generate loop's is. On a
real Valkey: the reader's first touch meets an outage; the watch's sleeps are recorded, not
slept."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.job_store import JobStore
from shared.keys import Keys
from tests.conftest import until_async
from tests.lane_rig import abandoned_after, queue_jobs
from workers.batching import long_run
from workers.batching.long_run import LongRun
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.reclaim import Reclaimer
from workers.partition.stream_reader import StreamReader

KEYS = Keys("long-touch:")
WORKER = "box-3-33"


class OutageOnce(StreamReader):
    """A reader whose first touch meets an outage (Redis unreachable), as a worker's may."""

    touches = 0

    async def touch(self, stream: str, entry_ids: Sequence[bytes | str]) -> list[str]:
        self.touches += 1
        if self.touches == 1:
            raise RedisConnectionError("Error 111 connecting to Redis. Connection refused.")
        return await super().touch(stream, entry_ids)


async def test_a_touch_an_outage_failed_is_tried_again_soon(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = abandoned_after(KEYS, 60)  # a touch every 20 s
    await queue_jobs(JobStore(aredis, KEYS, ttl_s=60), partition.online, "long")
    reader = OutageOnce(aredis, KEYS, partition.streams, WORKER)
    await reader.ensure_groups()
    reclaimer = Reclaimer(aredis, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))
    [(stream, batch)] = await LaneScheduler(partition, reader, reclaimer).next_batch(1, 0, 50)
    pauses: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(delay: float) -> None:
        pauses.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(
        long_run, "asyncio", types.SimpleNamespace(**{**vars(asyncio), "sleep": recorded})
    )
    watch = LongRun(reader, stream, batch, batch, partition.touch_every_s, 0, lambda: None)

    async def touched_after_the_outage() -> bool:
        return reader.touches >= 2 and len(pauses) >= 3

    try:
        await until_async(touched_after_the_outage, timeout=5, every=0.01)
    finally:
        watch.end()
    every_s = partition.touch_every_s
    # after the mark a period; after the failed touch much less; touched again, a period
    assert pauses[:3] == [every_s, long_run.TOUCH_RETRY_S, every_s], pauses

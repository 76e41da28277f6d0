"""A micro-batch held open long for more jobs (a `max_queue_delay_ms` near the visibility
timeout, which the config allows) is touched in time once it runs long: its first touch came a
third of the timeout after its read was claimed, so its oldest entry, untouched through the
gather too, was idle past the timeout meanwhile, for another worker's reclaimer to run again.
On a real Valkey; the watch's sleeps are recorded, not slept."""

from __future__ import annotations

import asyncio
import dataclasses
import types

import pytest
import redis.asyncio as aioredis

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

KEYS = Keys("r14long:")
WORKER = "box-14-2"
VISIBILITY_S = 60.0
GATHERED_S = 45.0  # max_queue_delay_ms may be up to the visibility timeout


async def test_the_first_touch_comes_before_a_long_gathers_entries_go_idle(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = abandoned_after(KEYS, VISIBILITY_S)  # a touch every 20 s
    await queue_jobs(JobStore(aredis, KEYS, ttl_s=60), partition.online, "gathered")
    reader = StreamReader(aredis, KEYS, partition.streams, WORKER)
    await reader.ensure_groups()
    reclaimer = Reclaimer(aredis, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))
    [(stream, batch)] = await LaneScheduler(partition, reader, reclaimer).next_batch(1, 0, 50)
    # read as the micro-batch's first job, GATHERED_S before the gather ended
    gathered = [
        dataclasses.replace(d, claimed_ms=d.claimed_ms - int(GATHERED_S * 1000)) for d in batch
    ]
    pauses: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(delay: float) -> None:
        pauses.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(
        long_run, "asyncio", types.SimpleNamespace(**{**vars(asyncio), "sleep": recorded})
    )
    watch = LongRun(reader, stream, gathered, gathered, partition.touch_every_s, 0, lambda: None)

    async def touched_once() -> bool:
        return len(pauses) >= 2

    try:
        await until_async(touched_once, timeout=5, every=0.01)
    finally:
        watch.end()
    # idle from its read to its first touch: the gather, the mark's wait, then the first pause
    idle_s = GATHERED_S + long_run.RUNNING_MARK_S + pauses[0]
    assert idle_s < VISIBILITY_S - partition.touch_every_s / 2, pauses
    assert pauses[1] == partition.touch_every_s  # then a touch a period, as ever

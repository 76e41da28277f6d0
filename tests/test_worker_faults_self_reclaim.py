"""On a real Valkey, no engine: after an outage longer than the visibility timeout, a staged
engine's micro-batch still running was idle past it (its touches failed), and the worker's own
reclaim took it over and handed it to the loop again: the job ran twice on the one worker, the
second run in the pipeline beside the first, and FINISH, which tells a run taken over by another
worker by its `worker`, could not tell this one."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.job_store import JobStore
from shared.keys import GROUP, Keys
from tests.lane_rig import abandoned_after, queue_jobs
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.reclaim import Reclaimer
from workers.partition.stream_reader import MicroBatch, StreamReader

KEYS = Keys("self-reclaim:")
WORKER = "box-4-44"


def _jobs(batches: list[MicroBatch]) -> list[str]:
    return [d.entry.job_id for _, deliveries in batches for d in deliveries if d.entry]


async def test_an_entry_in_hand_is_not_handed_over_again_by_its_own_reclaim(
    aredis: aioredis.Redis,
) -> None:
    partition = abandoned_after(KEYS, 0.2)
    await queue_jobs(JobStore(aredis, KEYS, ttl_s=60), partition.online, "running", "waiting")
    reader = StreamReader(aredis, KEYS, partition.streams, WORKER)
    await reader.ensure_groups()
    reclaimer = Reclaimer(aredis, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))
    lanes = LaneScheduler(partition, reader, reclaimer)
    [(stream, [running])] = await lanes.next_batch(1, 0, 50)
    in_hand = {(stream, running.entry_id)}  # in the staged engine's pipeline
    # its touches failed through an outage: idle past the visibility timeout, still ours
    await aredis.xclaim(stream, GROUP, WORKER, 0, [running.entry_id], idle=5_000, justid=True)

    await asyncio.sleep(reclaimer.interval_s)  # its lane's next reclaim is due
    handed = [_jobs(await lanes.next_batch(1, 0, 50, in_hand)) for _ in range(3)]

    assert "running" not in [job for batch in handed for job in batch]
    assert ["waiting"] in handed  # the loop goes on serving

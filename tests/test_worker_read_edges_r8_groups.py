"""A lane's stream or consumer group deleted under a running worker (an operator's DEL, a Redis
back without its data): the reader's calls recreate it and go on. On a real Valkey."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.job_store import JobStore
from shared.keys import GROUP, Keys
from tests.lane_rig import abandoned_after, queue_jobs
from workers.partition.stream_reader import StreamReader

KEYS = Keys("r8groups:")
PARTITION = abandoned_after(KEYS, 60)
WORKER = "box-8-82"


async def test_a_hand_back_to_a_vanished_group_hands_back_nothing_and_recreates_it(
    aredis: aioredis.Redis,
) -> None:
    """A drain's hand-back (its given-up generations) raised NOGROUP once the lane had been
    deleted, and the stop ended on that error instead of with the worker's clean exit."""
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    await queue_jobs(JobStore(aredis, KEYS, ttl_s=60), PARTITION.online, "given-up")
    [(_, [(entry_id, _)])] = await aredis.xreadgroup(GROUP, WORKER, {PARTITION.online: ">"})
    await aredis.delete(PARTITION.online)

    assert await reader.hand_back(PARTITION.online, [entry_id], 60_000) == 0

    groups = await aredis.xinfo_groups(PARTITION.online)
    assert [g["name"] for g in groups] == [GROUP.encode()]

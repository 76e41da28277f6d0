"""A token append checked against the job's lane entry (APPEND's KEYS[2]): taken while its
consumer holds the entry, refused once another worker took the entry over or the lane's group
vanished (Redis back without its data) rather than failing the whole tick's round trip, and, on
a real Valkey Cluster, run in one slot: the lane and the token stream share the partition's tag."""

from __future__ import annotations

from typing import cast

import pytest
import redis.asyncio as aioredis

from conveyor.valkey_cluster import LocalCluster
from shared.keys import GROUP, Keys, new_job_id
from shared.redis_client import RedisClient
from shared.token_stream import TokenEvent
from workers.partition.token_writer import EntryHolder, TokenAppend, TokenWriter

KEYS = Keys("holder:")
WORKER, TAKER = "box-7-77", "box-8-88"


async def _held(client: RedisClient, lane: str) -> bytes:
    """A lane entry WORKER was handed (as XREADGROUP hands it one)."""
    await client.xgroup_create(lane, GROUP, id="0", mkstream=True)
    await client.xadd(lane, {"job": "j"})
    [[_, [(entry_id, _)]]] = await client.xreadgroup(GROUP, WORKER, {lane: ">"}, count=1)
    return cast(bytes, entry_id)


async def _write(client: RedisClient, job_id: str, holder: EntryHolder, text: str) -> list[str]:
    """The job ids the write refused."""
    event = TokenEvent("token", text=text, tokens=1)
    append = TokenAppend(job_id, "run-a", 1, [event], expire=True, holder=holder)
    writer = TokenWriter(cast(aioredis.Redis, client), KEYS, 60)
    return (await writer.write([append], [])).refused


async def test_a_write_whose_lane_group_vanished_is_refused(aredis: aioredis.Redis) -> None:
    lane = KEYS.queue("m", "default")
    job_id = new_job_id("m", "default")
    entry_id = await _held(aredis, lane)
    await aredis.delete(lane)  # its group with it, as a Redis restarted empty

    assert await _write(aredis, job_id, EntryHolder(lane, entry_id, WORKER), "A1 ") == [job_id]
    assert await aredis.xlen(KEYS.tokens(job_id)) == 0


@pytest.mark.slow
async def test_a_checked_write_runs_in_one_slot_on_a_cluster(
    cluster: LocalCluster, cluster_client: RedisClient
) -> None:
    lane = KEYS.queue("m", "default")
    job_id = new_job_id("m", "default")
    holder = EntryHolder(lane, await _held(cluster_client, lane), WORKER)

    assert await _write(cluster_client, job_id, holder, "A1 ") == []
    await cluster_client.xclaim(lane, GROUP, TAKER, 0, [holder.entry_id])
    assert await _write(cluster_client, job_id, holder, "A2 ") == [job_id]
    rows = await cluster_client.xrange(KEYS.tokens(job_id))
    assert [fields[b"text"] for _, fields in rows] == [b"A1 "]

"""A partition's read that Valkey served but whose reply a dropped connection lost must reach
the worker's loop as the outage it is. redis-py sent it again unseen (a client `connect` made
retries through dropped connections): the loop saw nothing, never claimed back what the first
read handed over (`StreamReader.held`), and those entries sat in its pending list until a
reclaim, a visibility timeout later and one delivery more. On a real Valkey, no engine."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from shared import job_scripts
from shared.job_store import JobStore
from shared.keys import Keys
from shared.redis_client import RedisClient, connect
from tests.lane_rig import abandoned_after, queue_jobs
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.redis_backoff import serve_until_stopped
from workers.partition.stream_reader import Delivery, StreamReader

KEYS = Keys("reread:")
PARTITION = abandoned_after(KEYS, 60)
WORKER = "box-7-77"
Matches = Callable[[tuple[Any, ...]], bool]
TAKE_SHA = hashlib.sha1(job_scripts.TAKE.encode()).hexdigest()
# The reads whose reply is lost: the blocking read, and the TAKE script (a generate loop's first
# read of a turn, any loop's under a backlog).
READS: dict[str, Matches] = {
    "XREADGROUP": lambda args: args[0] == "XREADGROUP",
    "TAKE": lambda args: args[:2] == ("EVALSHA", TAKE_SHA),
}


@pytest.fixture
async def client(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[RedisClient]:
    """A client as a worker's (`connect`), on the emptied server."""
    made = connect(redis_url, name=WORKER)
    yield made
    await made.aclose()


@pytest.fixture
def lose_reply(monkeypatch: pytest.MonkeyPatch) -> Callable[[Matches], None]:
    """`lose_reply(matches)`: the next command `matches` runs on the server, then its reply is
    lost with its connection, as when the connection drops before the reply arrives."""
    armed: list[Matches] = []
    sent = aioredis.Redis._send_command_parse_response

    async def lost_once(self: aioredis.Redis, conn: Any, name: str, *args: Any, **kw: Any) -> Any:
        reply = await sent(self, conn, name, *args, **kw)
        if armed and armed[0](args):
            armed.clear()
            await conn.disconnect()
            raise RedisConnectionError("Connection closed by server.")
        return reply

    monkeypatch.setattr(aioredis.Redis, "_send_command_parse_response", lost_once)
    return armed.append


async def _served_after_a_lost_reply(
    client: RedisClient, partition: Partition, slots: bool = False
) -> tuple[list[Delivery], int]:
    """What the lanes hand `WORKER` through the loop's own handling of an outage (it backs
    off, then claims back what it was handed) once the reply the caller's `lose_reply` armed
    for was lost: the deliveries, and the turns it took."""
    reader = StreamReader(client, KEYS, partition.streams, WORKER)
    await reader.ensure_groups()
    reclaimer = Reclaimer(client, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))
    lanes = LaneScheduler(partition, reader, reclaimer)
    handed: list[Delivery] = []
    turns = 0

    async def turn() -> None:
        nonlocal turns
        turns += 1
        for _, deliveries in await lanes.next_batch(10, 0, 50, slots=slots):
            handed.extend(deliveries)

    going = lambda: not handed and turns < 5  # noqa: E731
    await serve_until_stopped(turn, asyncio.Event(), WORKER, lanes.outage, going)
    return handed, turns


@pytest.mark.parametrize("read", READS)
async def test_a_read_whose_reply_was_lost_hands_its_entries_over_at_once(
    client: RedisClient, lose_reply: Callable[[Matches], None], read: str
) -> None:
    await queue_jobs(JobStore(client, KEYS, ttl_s=60), PARTITION.online, "a", "b")
    lose_reply(READS[read])
    handed, turns = await _served_after_a_lost_reply(client, PARTITION, slots=read == "TAKE")

    assert [d.entry.job_id for d in handed if d.entry] == ["a", "b"]
    assert turns == 2  # the turn after the outage's, not a visibility timeout later
    assert [(d.attempts, d.redelivered) for d in handed] == [(1, False)] * 2


async def test_a_reclaim_whose_reply_was_lost_hands_its_entries_over_at_once(
    client: RedisClient, lose_reply: Callable[[Matches], None]
) -> None:
    """RECLAIM sent again claims nothing (the first send reset the entries' idle time): they sat
    in this consumer's pending list for another visibility timeout, a delivery more each."""
    partition = abandoned_after(KEYS, 1.0)
    await queue_jobs(JobStore(client, KEYS, ttl_s=60), partition.online, "a", "b")
    dead = StreamReader(client, KEYS, partition.streams, "box-6-66")
    await dead.ensure_groups()
    assert len((await dead.wait([partition.online], 10, None))[0][1]) == 2
    await asyncio.sleep(1.1)  # abandoned: idle past the visibility timeout
    reclaim_sha = hashlib.sha1(job_scripts.RECLAIM.encode()).hexdigest()
    lose_reply(lambda args: args[:2] == ("EVALSHA", reclaim_sha))
    handed, turns = await _served_after_a_lost_reply(client, partition)

    assert [d.entry.job_id for d in handed if d.entry] == ["a"]  # reclaimed one at a time
    assert turns == 2 and handed[0].redelivered

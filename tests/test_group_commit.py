"""Group commit on a real Valkey: commands issued in one event-loop turn reach Redis as one
pipeline (one read on the server, one flush), each caller gets its own reply or its own error,
and the order in which commands were issued is the order they run in."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from producer_api.jobs.group_commit import FLUSHES, group_committing
from shared.codec import RequestEntry, as_text
from shared.job_store import JobStore, QueueFull, now_ms
from shared.keys import Keys


def _entry() -> RequestEntry:
    return RequestEntry(uuid.uuid4().hex, {"inputs": {"text": "x"}}, now_ms())


async def _reads(client: aioredis.Redis) -> int:
    """Commands the server has read from its clients' sockets (INFO counts itself as one)."""
    return int((await client.info("stats"))["total_reads_processed"])


async def test_one_turn_of_enqueues_is_one_round_trip(aredis: aioredis.Redis) -> None:
    hot = group_committing(aredis, "", "hot")
    store = JobStore(hot, Keys("cv"), 60)
    await hot.ping()  # connect the pool and load nothing yet: the flush below is the first
    await store.create(_entry(), "cv:q:warm", {"model": "m"})  # the script is loaded now
    flushes = FLUSHES._value.get()
    reads = await _reads(aredis)
    entries = [_entry() for _ in range(20)]
    await asyncio.gather(*(store.create(e, "cv:q:m", {"model": "m"}) for e in entries))
    after = await _reads(aredis)
    assert FLUSHES._value.get() - flushes == 1
    assert after - reads == 2  # the pipeline and the second INFO
    assert await aredis.xlen("cv:q:m") == 20
    for entry in entries:
        assert await aredis.hget(Keys("cv").job(entry.job_id), "status") == b"queued"


async def test_a_refused_or_failing_command_fails_alone(aredis: aioredis.Redis) -> None:
    hot = group_committing(aredis, "", "hot")
    store = JobStore(hot, Keys("cv"), 60)
    await aredis.set("cv:plain", "not a list")
    flushes = FLUSHES._value.get()
    results = await asyncio.gather(
        *(store.create(_entry(), "cv:q:small", {"model": "m"}, max_length=3) for _ in range(5)),
        hot.lpush("cv:plain", "x"),  # WRONGTYPE
        hot.incr("cv:counter"),
        return_exceptions=True,
    )
    assert FLUSHES._value.get() - flushes == 1
    assert results[:3] == [0, 1, 2]  # each one's queue position: the jobs ahead of it
    assert all(isinstance(r, QueueFull) and r.length == 3 for r in results[3:5])
    assert isinstance(results[5], ResponseError) and "WRONGTYPE" in str(results[5])
    assert results[6] == 1
    assert await aredis.xlen("cv:q:small") == 3


async def test_issue_order_is_kept_within_a_turn_and_per_caller(aredis: aioredis.Redis) -> None:
    hot = group_committing(aredis, "", "hot")

    async def caller(name: str) -> list[str]:
        await hot.rpush("cv:log", f"{name}-1")
        await hot.rpush("cv:log", f"{name}-2")
        return [v for v in map(as_text, await hot.lrange("cv:log", 0, -1)) if v[:2] == name]

    seen = await asyncio.gather(*(caller(f"c{i}") for i in range(5)))
    for i, mine in enumerate(seen):
        assert mine == [f"c{i}-1", f"c{i}-2"]
    log = [as_text(v) for v in await aredis.lrange("cv:log", 0, -1)]
    assert log == [f"c{i}-1" for i in range(5)] + [f"c{i}-2" for i in range(5)]


async def test_a_lost_script_is_loaded_again(aredis: aioredis.Redis) -> None:
    """A restarted Redis forgets its scripts: every caller of the batch reloads and retries."""
    hot = group_committing(aredis, "", "hot")
    store = JobStore(hot, Keys("cv"), 60)
    await store.create(_entry(), "cv:q:m", {"model": "m"})
    await aredis.script_flush()
    await asyncio.gather(*(store.create(_entry(), "cv:q:m", {"model": "m"}) for _ in range(4)))
    assert await aredis.xlen("cv:q:m") == 5


async def test_a_lone_command_gets_its_own_reply_or_error(aredis: aioredis.Redis) -> None:
    """A turn of one command (a quiet producer's) is sent without a pipeline, as it was
    issued: its error is still its caller's, and the client goes on."""
    hot = group_committing(aredis, "", "hot")
    await aredis.set("cv:plain", "not a list")
    flushes = FLUSHES._value.get()
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await hot.lpush("cv:plain", "x")
    assert await hot.incr("cv:counter") == 1
    assert FLUSHES._value.get() - flushes == 2

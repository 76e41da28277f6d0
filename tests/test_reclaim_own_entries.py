"""On a real Valkey with a real consumer group, no engine: after an outage longer than the
visibility timeout, a worker's own entries, still running in its loop (`in_hand`), were idle
past it, and its own RECLAIM took them over from itself: a `crashed` attempt of its own went on
their jobs' history, and an entry at max_deliveries was dead-lettered while it still ran (its
result then refused). Those in hand are left as they are; others' are reclaimed as before, and
so are its own that it no longer runs (a process restarted under the same name)."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from tests.test_attempts import CONFIG  # a batch model reclaimed after 50 ms, twice at most
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.stream_reader import StreamReader

KEYS = Keys("reclaim-own:")
PARTITION = Partition.of(KEYS, CONFIG, "v")
STREAM = PARTITION.online


async def _pending(client: aioredis.Redis, consumer: str, *job_ids: str) -> list[bytes]:
    """Jobs queued, read by `consumer` and marked running by it: their entries' ids."""
    store = JobStore(client, KEYS, ttl_s=60)
    for job_id in job_ids:
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, STREAM, {"model": "m", "variant": "v"})
    reader = StreamReader(client, KEYS, PARTITION.streams, consumer)
    await reader.ensure_groups()
    deliveries = [d for _, got in await reader.wait([STREAM], 10, 100) for d in got]
    await reader.mark_running(deliveries)
    return [d.entry_id for d in deliveries]


async def _job(client: aioredis.Redis, job_id: str) -> tuple[str, list[str]]:
    """The job's status and the consumers of its attempts on record."""
    status, history = await client.hmget(KEYS.job(job_id), "status", "attempt_history")
    runs = json.loads(history) if history else []
    return status.decode(), [run["consumer"] for run in runs]


async def test_a_reclaim_leaves_its_own_entries_in_hand_and_takes_over_the_others(
    aredis: aioredis.Redis,
) -> None:
    [mine] = await _pending(aredis, "c1-1", "mine")
    await _pending(aredis, "c2-2", "theirs")
    # the outage: c1's touch of its entry failed, whose deliveries reach max_deliveries
    await aredis.xclaim(STREAM, GROUP, "c1-1", 0, [mine], retrycount=2, justid=True)
    await asyncio.sleep(0.1)  # both idle past the 50 ms visibility timeout
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "c1-1", 60, JobEvents("redis://unused"))

    reclaimed = await reclaimer.reclaim(STREAM, 10, in_hand={(STREAM, mine)})

    assert [d.entry.job_id for d in reclaimed if d.entry] == ["theirs"]
    assert reclaimed[0].attempts == 2
    assert await _job(aredis, "theirs") == ("running", ["c2-2"])  # c2's crashed attempt
    assert await _job(aredis, "mine") == ("running", [])  # no attempt of c1 taken over by c1
    assert await aredis.xlen(KEYS.dlq("m", "v")) == 0  # nor dead-lettered while it runs
    rows = await aredis.xpending_range(STREAM, GROUP, mine, mine, 1)
    assert (rows[0]["consumer"], rows[0]["times_delivered"]) == (b"c1-1", 2)  # untouched


async def test_a_reclaim_takes_over_its_own_entries_it_no_longer_runs(
    aredis: aioredis.Redis,
) -> None:
    """Run by an earlier process under the same name (a container restarted: same host, same
    pid): abandoned as any other consumer's."""
    await _pending(aredis, "c1-1", "orphan")
    await asyncio.sleep(0.1)  # idle past the 50 ms visibility timeout
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "c1-1", 60, JobEvents("redis://unused"))

    [again] = await reclaimer.reclaim(STREAM, 10)

    assert again.entry is not None and again.entry.job_id == "orphan"
    assert again.attempts == 2
    assert await _job(aredis, "orphan") == ("running", ["c1-1"])

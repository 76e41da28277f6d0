"""On a real Valkey: an abandoned entry whose job hash expired meanwhile (its TTL ran out while
its worker was gone) is reclaimed as `missing` and only acknowledged, or dead-lettered without
failing a job that is no more; neither brings a hash back to life (one with no TTL would live
for good), and the late write-back of the worker that lost it writes nothing either."""

from __future__ import annotations

import asyncio
from typing import cast

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from tests.test_attempts import CONFIG  # a batch model reclaimed after 50 ms, twice at most
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import Delivery, StreamReader

KEYS = Keys("expired-reclaim:")
PARTITION = Partition.of(KEYS, CONFIG, "v")
STREAM = PARTITION.online


async def _abandoned(
    client: aioredis.Redis, consumer: str, job_id: str, deliveries: int = 1
) -> Delivery:
    """`job_id` read and marked running by `consumer` (delivered `deliveries` times), then its
    hash expired."""
    store = JobStore(client, KEYS, ttl_s=60)
    await store.create(RequestEntry(job_id, {"inputs": {}}, now_ms()), STREAM, {"model": "m"})
    reader = StreamReader(client, KEYS, PARTITION.streams, consumer)
    await reader.ensure_groups()
    [(_, [delivery])] = await reader.wait([STREAM], 10, 100)
    await reader.mark_running([delivery])
    await client.xclaim(STREAM, GROUP, consumer, 0, [delivery.entry_id], retrycount=deliveries)
    await client.delete(KEYS.job(job_id))
    await asyncio.sleep(0.1)  # idle past the 50 ms visibility timeout
    return delivery


async def test_an_entry_whose_job_expired_is_reclaimed_as_missing_and_only_acknowledged(
    aredis: aioredis.Redis,
) -> None:
    lost = await _abandoned(aredis, "gone-1", "j")
    events = JobEvents("redis://unused")
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "next-2", 60, events)

    [delivery] = await reclaimer.reclaim(STREAM, 1)
    skip = PARTITION.skip_or_expire(delivery)
    writer = ResultWriter(aredis, KEYS, 60, events, "next-2")
    late = PARTITION.finish(lost, JobStatus.SUCCEEDED, {"outputs": "{}"})

    assert delivery.status == "missing" and skip is not None and not skip.status
    assert await writer.finish(STREAM, [skip]) == []
    assert await writer.finish(STREAM, [late]) == []  # the first worker, back at last
    await writer.close()
    assert not await aredis.exists(KEYS.job("j"))
    assert (await aredis.xpending(STREAM, GROUP))["pending"] == 0
    assert await aredis.xlen(KEYS.dlq("m", "v")) == 0


async def test_an_entry_whose_job_expired_is_dead_lettered_without_failing_a_job(
    aredis: aioredis.Redis,
) -> None:
    await _abandoned(aredis, "gone-1", "d", deliveries=2)  # its next one is past the max
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "next-2", 60, JobEvents("redis://unused"))

    assert await reclaimer.reclaim(STREAM, 1) == []

    dead = cast(list[tuple[bytes, dict[bytes, bytes]]], await aredis.xrange(KEYS.dlq("m", "v")))
    assert [(f[b"id"], f[b"deliveries"]) for _, f in dead] == [(b"d", b"2")]
    assert not await aredis.exists(KEYS.job("d"))
    assert (await aredis.xpending(STREAM, GROUP))["pending"] == 0

"""A job's `timings.total_ms` never reads below 0. It is the worker's `finished` less the
producer's `created`: a job submitted through a producer whose clock ran 30 s ahead of its
worker's, and done in a few ms, showed a total of about -30 000 ms, on its record and on the
reply an undecodable entry's FINISH restamps. On a real Valkey with the worker's own reader and
writer; the skewed producer's stamp is the job's `created`."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from tests.test_finish_r27_end_records import KEYS, PARTITION, REPLY, WORKER, undecodable_reply
from workers.partition.job_events import JobEvents
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

AHEAD_MS = 30_000  # the producer's clock less the worker's


async def _total_ms(store: JobStore, job_id: str) -> float:
    record = await store.get(job_id)
    assert record is not None
    total: float = record.view()["timings"]["total_ms"]
    return total


async def test_a_job_from_a_producer_ahead_of_its_worker_totals_no_less_than_0(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry("ahead", {"inputs": {}}, now_ms() + AHEAD_MS, reply=REPLY)
    await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    reader = StreamReader(aredis, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    [(_, [delivery])] = await reader.wait([PARTITION.online], 10, None)
    assert PARTITION.skip_or_expire(delivery) is None  # no deadline: it runs
    finish = PARTITION.finish(delivery, JobStatus.SUCCEEDED, {"outputs": "{}"})
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), WORKER)
    try:
        await writer.finish(PARTITION.online, [finish])
    finally:
        await writer.close()
    assert await _total_ms(store, "ahead") == 0


async def test_an_undecodable_entrys_restamped_reply_totals_no_less_than_0(
    aredis: aioredis.Redis,
) -> None:
    _, view = await undecodable_reply(aredis, "odd-ahead", now_ms() + AHEAD_MS)
    assert view["status"] == "failed" and view["timings"]["total_ms"] == 0
    assert await _total_ms(JobStore(aredis, KEYS, ttl_s=60), "odd-ahead") == 0

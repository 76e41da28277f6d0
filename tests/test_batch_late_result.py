"""A result that came after a batch's window is not the batch's, whoever counts it and whenever:
workers check an item's deadline when they read it, not when they write its result, so an item
running as the window ends may still succeed a moment later. Counted by a sweeper tick before
that result, the item was expired and dropped; counted after it, every item was done, no item
`expired`, and the batch ended `completed` with the late result in its output file."""

from __future__ import annotations

import redis.asyncio as aioredis

from producer_api.batch_api.progress import BatchApiProgress
from producer_api.batch_api.sweeper import BatchApiSweeper
from shared.batch_api_store import BatchApiStore, BatchStatus, final_counts, window_end
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from tests.test_batch_sweeps import ITEMS, KEYS, TTL_S, WEBHOOKS, _running_batch


async def test_a_result_past_the_window_ends_a_batch_whose_items_all_succeeded_expired(
    aredis: aioredis.Redis,
) -> None:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    expires_at = now_ms() - 1_000
    await store.set_fields(batch_id, {"expires_at": expires_at})
    ids = [job_id.decode() for job_id in await aredis.lrange(KEYS.batch_items(batch_id), 0, -1)]
    late = ids[1]  # its worker read it within the window and wrote its result just past it
    for job_id in ids:
        finished = expires_at + 1 if job_id == late else expires_at - 1
        ended = {"status": JobStatus.SUCCEEDED.value, "finished": finished, "outputs": "{}"}
        await aredis.hset(KEYS.job(job_id), mapping=ended)
    await aredis.zadd(KEYS.batches_active, {batch_id: now_ms()})  # the sweeper finds it due

    await BatchApiSweeper(store, BatchApiProgress(jobs, store, WEBHOOKS)).sweep()
    fields = await store.read(batch_id) or {}
    assert fields["status"] == BatchStatus.EXPIRED, fields
    assert final_counts(fields) == {
        "succeeded": ITEMS - 1, "failed": 0, "cancelled": 0, "expired": 1,
    }  # fmt: skip
    reported = store.items(batch_id, window_end(fields["status"], fields))
    output = [
        item.job_id async for chunk in reported for item in chunk if item.status == "succeeded"
    ]
    assert output == [job_id for job_id in ids if job_id != late]
    assert await store.active() == []

"""A batch counted for the last time only after its window ended (the sweeper's tick came just
past it, or no producer ran then) ends as its items ended: `expired` when the window stopped one
of them, `completed` when each ended within it. An item `expired` by its line's own `deadline`,
earlier than the window, is the line's end, not the window's: such a batch ended `expired`
(batch.expired, `conveyor batch submit --wait` exiting 1) though every item ended in time."""

from __future__ import annotations

import redis.asyncio as aioredis

from producer_api.batch_api.progress import BatchApiProgress
from producer_api.batch_api.sweeper import BatchApiSweeper
from shared.batch_api_store import BatchApiStore, BatchStatus, final_counts
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from tests.test_batch_sweeps import ITEMS, KEYS, TTL_S, WEBHOOKS, _running_batch


async def _ended_by_its_window_end(aredis: aioredis.Redis, own_deadline: bool) -> dict[str, str]:
    """A batch whose first item expired (by its line's own deadline, or the window's), the
    others succeeded before the window ended; swept once past it."""
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    window_end = now_ms() - 1_000
    await store.set_fields(batch_id, {"expires_at": window_end})
    ids = [job_id.decode() for job_id in await aredis.lrange(KEYS.batch_items(batch_id), 0, -1)]
    expired = {
        "status": JobStatus.EXPIRED.value,
        "deadline": window_end - 60_000 if own_deadline else window_end,
        "finished": window_end - 59_000 if own_deadline else window_end + 1,
    }
    await aredis.hset(KEYS.job(ids[0]), mapping=expired)
    for job_id in ids[1:]:
        ended = {
            "status": JobStatus.SUCCEEDED.value,
            "deadline": window_end,
            "finished": window_end - 1,
            "outputs": "{}",
        }
        await aredis.hset(KEYS.job(job_id), mapping=ended)
    await aredis.zadd(KEYS.batches_active, {batch_id: window_end})

    await BatchApiSweeper(store, BatchApiProgress(jobs, store, WEBHOOKS)).sweep()
    fields = await store.read(batch_id) or {}
    counts = {"succeeded": ITEMS - 1, "failed": 0, "cancelled": 0, "expired": 1}
    assert final_counts(fields) == counts, fields
    assert await store.active() == []
    return fields


async def test_an_item_expired_by_its_own_deadline_leaves_its_batch_completed(
    aredis: aioredis.Redis,
) -> None:
    fields = await _ended_by_its_window_end(aredis, own_deadline=True)
    assert fields["status"] == BatchStatus.COMPLETED


async def test_an_item_the_window_expired_ends_its_batch_expired(aredis: aioredis.Redis) -> None:
    fields = await _ended_by_its_window_end(aredis, own_deadline=False)
    assert fields["status"] == BatchStatus.EXPIRED

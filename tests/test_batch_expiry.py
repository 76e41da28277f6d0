"""An expired batch's results that came after its window are not its: OpenAI's expired batch
answers only what completed before it expired. Its finalizer counts them as expired, as the
files report them, in the view it answers and hands its webhook as well as in the batch's hash,
and a second finalizer (one that took over a silent one) does not move them twice."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from producer_api.batch_api.progress import BatchApiProgress
from shared.batch_api_store import BatchApiStore, BatchStatus, final_counts, window_end
from shared.job_store import JobStore, now_ms
from tests.test_batch_sweeps import KEYS, TTL_S, WEBHOOKS, _running_batch

WINDOW_END = 1_000_000
# Each of _running_batch's items as it ended: (status, its job's `finished` stamp).
ENDS = [
    ("succeeded", WINDOW_END - 1),
    ("succeeded", WINDOW_END),
    ("succeeded", WINDOW_END + 1),  # late: the errors file's `expired`
    ("failed", WINDOW_END + 1),  # late too
    ("expired", WINDOW_END + 1),  # the expiry stopped it
]
COUNTS = {"succeeded": 2, "failed": 0, "cancelled": 0, "expired": 3}


async def test_the_finalizer_counts_an_expired_batchs_late_results_as_expired(
    aredis: aioredis.Redis,
) -> None:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    ids = await aredis.lrange(KEYS.batch_items(batch_id), 0, -1)
    for job_id, (status, finished) in zip(ids, ENDS, strict=True):
        await aredis.hset(
            KEYS.job(job_id.decode()), mapping={"status": status, "finished": finished}
        )
    await store.set_fields(batch_id, {"expires_at": WINDOW_END})
    await store.request_end(batch_id, BatchStatus.EXPIRED)

    progress = await BatchApiProgress(jobs, store, WEBHOOKS).refresh(batch_id, window=0)
    assert progress is not None and progress.finalize
    assert progress.fields["status"] == "expired" and progress.counts == COUNTS
    until = window_end("expired", progress.fields)
    reported = [item.status async for chunk in store.items(batch_id, until) for item in chunk]
    assert reported == ["succeeded", "succeeded", "expired", "expired", "expired"]

    await store.finish(batch_id, BatchStatus.EXPIRED)  # a finalizer that came after the commit
    fields = await store.read(batch_id)
    assert fields is not None and final_counts(fields) == COUNTS


@pytest.mark.parametrize(
    ("ttl_s", "late_s"),
    [(TTL_S, 120), (86_400, 7200)],
    ids=["finalizer replaced", "producers down"],
)
async def test_a_batch_finalized_after_its_window_is_listed_while_its_hash_lives(
    aredis: aioredis.Redis, ttl_s: int, late_s: int
) -> None:
    """An expired batch is finalized after its window (a replaced finalizer: a minute or more;
    the sweeper after an outage of every producer: up to a TTL, its hash's life), and its hash
    lives a TTL from then: its index entry, dropped 2 TTLs (then 2 TTLs and an hour) after it
    was listed, left the list while `GET /v1/batches/{id}` still answered it."""
    store = BatchApiStore(aredis, KEYS, ttl_s)
    batch_id = f"batch_{uuid.uuid4().hex}"
    await store.create(batch_id, {"tenant": "late"}, ttl_s)  # as `finish` leaves it
    listed_at = now_ms() - (2 * ttl_s + late_s) * 1000  # window, finalized late, TTL
    await aredis.zadd(KEYS.batches_of("late"), {batch_id: listed_at})

    async def look(ids: list[str]) -> list[dict[str, str] | None]:
        return [await store.read(record_id) for record_id in ids]

    page = await store.page("late", None, 10, look)
    assert [record_id for record_id, _ in page.found] == [batch_id]

"""What every producer's sweeper does for batches nobody looks at, when one of them cannot be
read: a batch whose keys a Redis refuses (in a cluster, its slot's master down; here a key of the
wrong type, the one refusal a single real Valkey gives) raised out of the whole sweep, so every
batch after it in the active index stayed running past its window and no held item of any batch
was fed, sweep after sweep. And an ended batch leaves no key behind for ever: the index of ended
batches (the console's) lived on with no TTL once the last batch had ended."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from producer_api.batch_api.progress import BatchApiProgress
from producer_api.batch_api.sweeper import BatchApiSweeper
from shared.batch_api_store import ENDED_KEPT_MS, BatchApiStore, BatchStatus
from shared.codec import RequestEntry
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import Keys, new_job_id
from shared.webhook_events import WebhookDispatcher

KEYS = Keys("batch-r11-sweeps:")
TTL_S = 600
WEBHOOKS = WebhookDispatcher("redis://unused")  # the batches have no webhook: never sent


async def _running_batch(aredis: aioredis.Redis, expires_ms: int) -> str:
    """A running batch of one queued item, enqueued as the Batch API does."""
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = f"batch_{uuid.uuid4().hex}"
    open_list = KEYS.batch_open(batch_id, "identity", "default")
    job_id = new_job_id("identity", "default")
    await store.create(batch_id, {"tenant": "default", "total": 1, "expires_at": expires_ms}, TTL_S)
    fields: dict[str, str | int] = {
        "model": "identity",
        "variant": "default",
        "batch": batch_id,
        "line": 1,
    }
    stream = KEYS.bulk_queue("identity", "default")
    entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
    assert await jobs.create_many([NewJob(entry, stream, fields)]) == []
    await store.add_items(batch_id, [(job_id, open_list)], [], TTL_S)
    await store.start(batch_id, [open_list], 1, {"invalid": 0}, expires_ms)
    return batch_id


def _sweeper(aredis: aioredis.Redis) -> tuple[BatchApiStore, BatchApiSweeper]:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    return store, BatchApiSweeper(store, BatchApiProgress(jobs, store, WEBHOOKS))


async def test_a_batch_redis_refuses_does_not_stop_the_sweep_of_the_others(
    aredis: aioredis.Redis,
) -> None:
    past = now_ms() - 1000
    refused = await _running_batch(aredis, past - 1)  # first in the active index
    expired = await _running_batch(aredis, past)
    unreadable = KEYS.batch_open(refused, "identity", "default")
    await aredis.delete(unreadable)
    await aredis.set(unreadable, "not a list")  # COUNT on it raises WRONGTYPE

    store, sweeper = _sweeper(aredis)
    await sweeper.sweep()

    fields = await store.read(expired)
    assert fields is not None and fields["status"] == BatchStatus.EXPIRED, fields
    assert fields["n_expired"] == "1"
    assert [batch_id for batch_id, _ in await store.active()] == [refused]  # tried again


async def test_the_index_of_ended_batches_expires_once_none_ends(aredis: aioredis.Redis) -> None:
    batch_id = await _running_batch(aredis, now_ms() + TTL_S * 1000)
    store, sweeper = _sweeper(aredis)
    await sweeper.progress.end(batch_id, BatchStatus.CANCELLED)

    assert await store.ended_since(0) == [batch_id]
    assert 0 < await aredis.pttl(KEYS.batches_ended) <= ENDED_KEPT_MS

"""A batch whose hash expired (its TTL ran out, or an operator's DEL) while its end was under way
is not brought back: a write after the hash's last read recreated it holding only what that
write set, with no TTL, a key that lived for ever and a batch that read back broken
(`GET /v1/batches/{id}` answered 500, its hash lacking a `status`)."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from producer_api.batch_api.progress import BatchApiProgress
from producer_api.batch_api.sweeper import BatchApiSweeper
from shared.batch_api_store import BatchApiStore, BatchStatus
from shared.job_store import JobStore
from shared.webhook_events import WebhookDispatcher
from tests.test_batch_sweeps import KEYS, TTL_S, WEBHOOKS, _running_batch


class _Broker(WebhookDispatcher):
    """Takes every webhook; with `expiring`, while the batch's hash expires (deleted here, as
    its TTL would)."""

    def __init__(self, expiring: aioredis.Redis | None = None) -> None:
        super().__init__("redis://unused")
        self.expiring = expiring
        self.sent: list[str] = []

    def send(self, kind: Any, target_id: str, url: str, body: dict[str, Any]) -> None:
        self.sent.append(body["type"])

    async def hand_over(self, kind: Any, target_id: str, url: str, body: dict[str, Any]) -> bool:
        if self.expiring is not None:
            await self.expiring.delete(KEYS.batch(target_id))
        return await super().hand_over(kind, target_id, url, body)


async def _batch_with_webhook(store: BatchApiStore, jobs: JobStore) -> str:
    batch_id = await _running_batch(store, jobs)
    await store.set_fields(batch_id, {"webhook": "https://hooks.example.com/batches"})
    return batch_id


async def test_a_webhook_handed_over_as_its_batch_expires_does_not_bring_the_batch_back(
    aredis: aioredis.Redis,
) -> None:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _batch_with_webhook(store, jobs)
    broker = _Broker(expiring=aredis)

    ended = await BatchApiProgress(jobs, store, broker).end(batch_id, BatchStatus.CANCELLED)
    assert ended == BatchStatus.CANCELLED
    assert broker.sent == ["batch.cancelled"]  # handed over all the same
    assert await aredis.exists(KEYS.batch(batch_id)) == 0
    assert await store.read(batch_id) is None  # a GET's 404, as for any batch gone
    assert await store.active() == []


async def test_a_webhook_handed_over_marks_a_batch_still_there_pending(
    aredis: aioredis.Redis,
) -> None:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _batch_with_webhook(store, jobs)
    progress = BatchApiProgress(jobs, store, _Broker())

    assert await progress.end(batch_id, BatchStatus.CANCELLED) == BatchStatus.CANCELLED
    assert (await store.read(batch_id) or {})["webhook_status"] == "pending"
    await aredis.hset(KEYS.batch(batch_id), "webhook_status", "delivered")  # the task's mark
    await store.set_field_unless_set(batch_id, "webhook_status", "pending")
    assert (await store.read(batch_id) or {})["webhook_status"] == "delivered"


async def test_a_batch_that_expires_before_its_finalizer_commits_is_not_brought_back(
    aredis: aioredis.Redis,
) -> None:
    """The commit wrote the ending into a hash gone since the finalizer's count: a batch of a
    `status` and its time alone (no tenant, no counts, no times), which its webhook reported."""
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    await aredis.delete(KEYS.batch(batch_id))

    assert await store.finish(batch_id, BatchStatus.COMPLETED) == BatchStatus.COMPLETED
    assert await aredis.exists(KEYS.batch(batch_id)) == 0
    progress = BatchApiProgress(jobs, store, WEBHOOKS)
    assert await progress.refresh(batch_id, window=0) is None


async def test_a_batch_hash_left_with_no_status_reads_as_gone(aredis: aioredis.Redis) -> None:
    """What the old hand-over left, a hash of `webhook_status` alone that never expires, made
    every look at its batch fail (KeyError: a 500 for GET /v1/batches/{id}, the sweeper's loop
    stopped at it); it reads as gone, the 404 of any batch whose keys expired."""
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    await aredis.delete(KEYS.batch(batch_id))
    await aredis.hset(KEYS.batch(batch_id), "webhook_status", "pending")

    assert await store.read(batch_id) is None
    assert await BatchApiProgress(jobs, store, WEBHOOKS).refresh(batch_id, window=0) is None
    await BatchApiSweeper(store, BatchApiProgress(jobs, store, WEBHOOKS)).sweep()
    assert await store.active() == []

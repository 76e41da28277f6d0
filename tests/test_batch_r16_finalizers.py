"""A finalizer that took over a silent one (STALE_MS) may commit first; the silent one, waking,
committed its own end over it: a batch the client had read `expired`, its late results counted
expired, came back `completed` with no result completed (the first finalizer had read the
batch before its window ended). An ended batch keeps the end committed first, and the late
finalizer answers with it. Stack-free: a real Valkey, the items' results written as a worker
writes them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from shared.batch_api_store import BatchApiStore, BatchStatus, ItemState, final_counts
from shared.codec import as_text
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from tests.conftest import until_async
from tests.test_batch_sweeps import ITEMS, KEYS, TTL_S, _running_batch

WINDOW_MS = 200  # the batch's window ends this long after the test starts


class _SilentFinalizer(BatchApiStore):
    """A finalizer that has read the batch and goes silent before reading its items."""

    def __init__(self, client: aioredis.Redis, gate: asyncio.Event) -> None:
        super().__init__(client, KEYS, TTL_S)
        self.gate = gate
        self.reading = False

    async def items(
        self, batch_id: str, until: int | None = None
    ) -> AsyncIterator[list[ItemState]]:
        self.reading = True
        await self.gate.wait()
        async for chunk in super().items(batch_id, until):
            yield chunk


async def _late_results(redis: aioredis.Redis, batch_id: str, expires_at: int) -> None:
    """Every item succeeded, stamped after the batch's window ended."""
    ended = {"status": JobStatus.SUCCEEDED.value, "finished": expires_at + 1, "outputs": "{}"}
    for job_id in await redis.lrange(KEYS.batch_items(batch_id), 0, -1):
        await redis.hset(KEYS.job(as_text(job_id)), mapping=ended)


async def _past(moment_ms: int) -> bool:
    return now_ms() > moment_ms


async def _reading(finalizer: _SilentFinalizer) -> bool:
    return finalizer.reading


async def test_a_silent_finalizer_keeps_the_end_its_successor_committed(
    aredis: aioredis.Redis,
) -> None:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    expires_at = now_ms() + WINDOW_MS
    await aredis.hset(KEYS.batch(batch_id), "expires_at", expires_at)
    await _late_results(aredis, batch_id, expires_at)
    refreshed = await store.refresh(batch_id, window=0)
    assert refreshed is not None and refreshed.finalize  # counted: finalizing

    silent = _SilentFinalizer(aredis, asyncio.Event())
    first = asyncio.create_task(silent.finish(batch_id, BatchStatus.COMPLETED))
    await until_async(lambda: _reading(silent), every=0.01)  # it read the batch in its window
    await until_async(lambda: _past(expires_at), every=0.01)
    assert await store.finish(batch_id, BatchStatus.COMPLETED) == BatchStatus.EXPIRED
    silent.gate.set()

    assert await first == BatchStatus.EXPIRED
    fields = await store.read(batch_id) or {}
    assert fields["status"] == BatchStatus.EXPIRED, fields
    assert "completed_at" not in fields
    assert final_counts(fields) == {"succeeded": 0, "failed": 0, "cancelled": 0, "expired": ITEMS}

"""A finalizer that went silent past STALE_MS, while it set its items' expiry from its own
(earlier) end, and woke after its successor committed the batch, left the items expiring at
its end's time, not at the committed end's: the last stretch of the output file's advertised
life read "record expired" lines. The items keep the committed end's expiry. Two producers'
progress objects on one batch, a real Valkey, the items' results written as a worker writes
them."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.typing import EncodableT

from producer_api.batch_api.progress import BatchApiProgress
from shared.batch_api_store import STALE_MS, BatchApiStore, BatchStatus
from shared.codec import as_text
from shared.file_expiry import file_expiry
from shared.job_store import JobStore, now_ms
from tests.conftest import until_async
from tests.test_batch_r16_finalizers import _reading, _SilentFinalizer
from tests.test_batch_sweeps import KEYS, TTL_S, WEBHOOKS, _running_batch


async def _in_a_later_second(than_ms: int) -> bool:
    return now_ms() // 1000 > than_ms // 1000


async def _item_ids(aredis: aioredis.Redis, batch_id: str) -> list[str]:
    return [as_text(job_id) for job_id in await aredis.lrange(KEYS.batch_items(batch_id), 0, -1)]


async def test_a_late_finalizer_leaves_the_items_the_committed_ends_expiry(
    aredis: aioredis.Redis,
) -> None:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    done: dict[EncodableT, EncodableT] = {
        "status": "succeeded",
        "finished": now_ms(),
        "outputs": "",
    }
    for job_id in await _item_ids(aredis, batch_id):  # as a worker writes its result
        await aredis.hset(KEYS.job(job_id), mapping=done)

    silent = _SilentFinalizer(aredis, asyncio.Event())
    first = asyncio.create_task(BatchApiProgress(jobs, silent, WEBHOOKS).refresh(batch_id, 0))
    await until_async(lambda: _reading(silent), every=0.01)  # it has taken its end's time
    read_at = now_ms()
    await until_async(lambda: _in_a_later_second(read_at), every=0.01)  # its files' clock ticks
    # silent past its stale time: the next look takes the batch over and commits it
    await aredis.hset(KEYS.batch(batch_id), "finalizing_at", now_ms() - STALE_MS - 1)
    taken = await BatchApiProgress(jobs, store, WEBHOOKS).refresh(batch_id, 0)
    assert taken is not None and taken.fields["status"] == BatchStatus.COMPLETED, taken
    silent.gate.set()
    assert (await first) is not None

    fields = await store.read(batch_id) or {}
    assert fields["status"] == BatchStatus.COMPLETED
    files_until = file_expiry(int(fields["completed_at"]) // 1000, None, TTL_S)
    kept = [KEYS.job(job_id) for job_id in await _item_ids(aredis, batch_id)]
    expiries = [await aredis.execute_command("EXPIRETIME", key) for key in kept]
    assert expiries == [files_until] * len(kept) and kept  # the file's, not the silent one's

"""A finalizer's commit (`BatchApiStore.finish`) reads the end in force's time in its COMMIT
script, not with an HGET of its own after it: one round trip and one command less per batch
end. Counted by a real Valkey itself (INFO commandstats, which counts the commands scripts
run); the batch enqueued as the Batch API does, its items' results written as a worker writes
them."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.typing import EncodableT

from shared import batch_api_scripts
from shared.batch_api_store import BatchApiStore, BatchStatus
from shared.codec import as_text
from shared.job_store import JobStore, now_ms
from tests.test_batch_sweeps import KEYS, TTL_S, _running_batch
from tests.test_worker_redis_cost import _commands


async def test_a_commit_reads_the_ends_time_in_its_script(aredis: aioredis.Redis) -> None:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    done: dict[EncodableT, EncodableT] = {"status": "succeeded", "finished": now_ms()}
    for job_id in await aredis.lrange(KEYS.batch_items(batch_id), 0, -1):
        await aredis.hset(KEYS.job(as_text(job_id)), mapping=done)

    await aredis.script_load(batch_api_scripts.COMMIT)  # as a producer that committed before
    before = await _commands(aredis)
    assert await store.finish(batch_id, BatchStatus.COMPLETED) == BatchStatus.COMPLETED
    used = await _commands(aredis) - before

    assert used["hget"] == 1, used  # COMMIT's read of the status; none after it
    assert used["evalsha"] == 1, used
    fields = await store.read(batch_id) or {}
    assert fields["status"] == "completed" and "completed_at" in fields

"""A submit cancelled while its ENQUEUE waits in a group's flush hears of its cancel only once
the flush ran: what its cleanup then looks for (`_nothing_enqueued`) is what the flush did, and
no job appears after its caller got the error (a key given back for a job enqueued later let a
retry enqueue it twice)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from producer_api.jobs.group_commit import group_committing
from shared.codec import RequestEntry
from shared.job_scripts import ENQUEUE
from shared.job_store import JobStore, merged_enqueues, now_ms
from shared.keys import Keys
from shared.redis_client import preload


async def test_a_submit_cancelled_in_its_flush_finds_its_job_when_told(
    aredis: aioredis.Redis,
) -> None:
    hot = group_committing(aredis, "", "hot", {ENQUEUE: merged_enqueues})  # as the app's
    store = JobStore(hot, Keys("cv"), 60)
    await preload(aredis, [ENQUEUE])
    entries = [RequestEntry(uuid.uuid4().hex, {"inputs": {}}, now_ms()) for _ in range(3)]
    submits = [asyncio.ensure_future(store.create(e, "cv:q:m", {"model": "m"})) for e in entries]
    while not hot._pending:  # type: ignore[attr-defined]  # queued, not yet sent
        await asyncio.sleep(0)
    submits[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await submits[1]
    told = await store.exists(entries[1].job_id)
    await asyncio.gather(submits[0], submits[2])
    final = await store.exists(entries[1].job_id)
    assert told and final
    assert await aredis.xlen("cv:q:m") == 3  # each job once, the others answered on their own

"""`JobStore.enqueue_through`, on a real Valkey: the one reader of ENQUEUE's reply, for a
submit (ENQUEUE) and a dead letter's replay (REPLAY_LETTER, built around ENQUEUE's body), which
had each turned its refusals into QueueFull / TooFarBack with a copy of the other's code."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import RequestEntry
from shared.job_store import JobStore, NewJob, QueueFull, TooFarBack, now_ms
from shared.keys import Keys, new_job_id

KEYS = Keys("dlq-r26-through:")
STREAM = KEYS.queue("m", "v")


def _job() -> NewJob:
    entry = RequestEntry(new_job_id("m", "v"), {"inputs": {}}, now_ms())
    return NewJob(entry, STREAM, {"model": "m", "variant": "v"})


async def test_a_refusal_is_raised_and_an_admission_gives_the_reply(
    aredis: aioredis.Redis,
) -> None:
    async for key in aredis.scan_iter(match=f"{KEYS.prefix}*"):
        await aredis.delete(key)
    store = JobStore(aredis, KEYS, ttl_s=60)
    enqueue = aredis.register_script(job_scripts.ENQUEUE)
    assert await store.enqueue_through(enqueue, _job(), max_length=0) == (1, 0)
    with pytest.raises(QueueFull) as full:
        await store.enqueue_through(enqueue, _job(), max_length=1)
    assert (full.value.stream, full.value.length) == (STREAM, 1)
    with pytest.raises(TooFarBack) as back:
        await store.enqueue_through(enqueue, _job(), max_length=0, max_ahead=0)
    assert (back.value.stream, back.value.ahead) == (STREAM, 1)
    assert await aredis.xlen(STREAM) == 1  # neither refused job was written
    # REPLAY_LETTER's own code (3: its letter is gone) is handed back, nothing enqueued
    replay = aredis.register_script(job_scripts.REPLAY_LETTER)
    letter = ([KEYS.dlq("m", "v")], ["1-1"])
    assert await store.enqueue_through(replay, _job(), 0, -1, letter) == (3, 0)
    assert await aredis.xlen(STREAM) == 1

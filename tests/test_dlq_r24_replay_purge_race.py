"""A dead letter replayed and purged at once, on a real Valkey: a purge of the letter that landed
between a replay's read of it and its enqueue reported the letter discarded while the replay
still enqueued it as a job. A letter is now replayed or purged, never both."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.dead_letters import PAGE, DeadLetter, DeadLetters
from shared.job_store import JobStore
from shared.keys import Keys, replay_job_id
from tests.test_dead_letter_replays import MODEL, VARIANT, _dead_letter

KEYS = Keys("dlq-r24a:")


def _letters(client: aioredis.Redis) -> DeadLetters:
    return DeadLetters(JobStore(client, KEYS, 60), KEYS, MODEL, VARIANT)


async def test_a_letter_purged_after_a_replay_read_it_is_not_replayed(
    aredis: aioredis.Redis,
) -> None:
    async for key in aredis.scan_iter(match=f"{KEYS.prefix}*"):
        await aredis.delete(key)
    lane = KEYS.queue(MODEL, VARIANT)
    old = await _dead_letter(aredis, "t", lane, partition=(KEYS, MODEL))
    [(raw_id, _)] = await aredis.xrange(KEYS.dlq(MODEL, VARIANT))
    dlq_id = raw_id.decode()
    replaying = _letters(aredis)
    has_read, purged, read = asyncio.Event(), asyncio.Event(), replaying.entries

    async def read_then_wait(count: int = PAGE, after: str = "") -> list[DeadLetter]:
        found = await read(count, after)
        has_read.set()
        await purged.wait()  # the purge lands between this read and the enqueue
        return found

    replaying.entries = read_then_wait  # type: ignore[method-assign]
    replay = asyncio.create_task(replaying.replay())
    await has_read.wait()
    assert await _letters(aredis).purge([dlq_id]) == 1  # the operator is told it is discarded
    purged.set()
    result = await replay
    assert result.replayed == [] and result.kept == []
    assert not await aredis.exists(KEYS.job(replay_job_id(MODEL, VARIANT, old, dlq_id)))
    assert await aredis.xlen(lane) == 0

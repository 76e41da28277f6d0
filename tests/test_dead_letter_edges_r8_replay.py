"""Dead-letter replays into a fair lane on a real Valkey, no stack: a letter replayed twice is
one job, even when the first replay's held job lost its hash before the second came."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import redis.asyncio as aioredis

from shared.dead_letters import DeadLetter, DeadLetters
from shared.job_store import JobStore
from tests.test_dead_letter_replays import _dead_letter
from tests.test_fair_queuing import KEYS, _config, _job, _lane


async def test_a_letter_replayed_again_after_its_held_job_expired_runs_once(
    aredis: aioredis.Redis,
) -> None:
    """Two replays read the letter; the first held its job (the lane's window full), whose hash
    then expired while held, so the second's ENQUEUE found no hash and held the same job again:
    two entries of one job in its tenant's list, and refill moved both in, the replay run
    twice. A replay now runs only while its letter is there (or its job: REPLAY_LETTER), so the
    second replays nothing; and a job held twice all the same (its ENQUEUE rerun after its
    hash expired) runs once: a held entry whose job is no longer held (moved in) is dropped."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    assert await store.create_many([_job(config, "x")]) == []  # the window, so replays are held
    old = await _dead_letter(aredis, "t", stream, partition=(KEYS, "m"))
    second = DeadLetters(JobStore(aredis, KEYS, 60), KEYS, "m", "default", fair_window=1)
    has_read, first_done, read = asyncio.Event(), asyncio.Event(), second.entries

    async def read_then_wait(count: int = 1000, after: str = "") -> list[DeadLetter]:
        found = await read(count, after)
        has_read.set()
        await first_done.wait()
        return found

    second.entries = read_then_wait  # type: ignore[method-assign]
    late = asyncio.create_task(second.replay())
    await has_read.wait()
    first = DeadLetters(store, KEYS, "m", "default", fair_window=1)
    ((replayed, new),) = (await first.replay()).replayed
    assert replayed == old
    assert await aredis.hget(KEYS.job(new), "held") == b"1"
    await aredis.delete(KEYS.job(new))  # its TTL ran out while it was held
    first_done.set()
    assert (await late).replayed == []  # the letter went with the first replay's ENQUEUE
    again = replace(_job(config, "t"), may_exist=True)
    assert await store.create_many([again]) == []  # held: the window is full
    await aredis.delete(KEYS.job(again.entry.job_id))  # its TTL ran out while it was held
    assert await store.create_many([again]) == []  # found no hash: held again

    runs: list[str] = []
    for _ in range(3):
        taken = await reader.take([stream], 4)
        runs += [d.entry.job_id for d in taken[1] if d.runnable and d.entry] if taken else []
    assert runs.count(again.entry.job_id) == 1, runs
    assert await aredis.hget(KEYS.fair(stream), "held") == b"0"

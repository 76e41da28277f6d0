"""A held job's position counts none of its tenant's jobs that ended while held ahead of it:
POSITION counts them off by their places in the tenant's list (docs/architecture.md, "Position
in O(1)")."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.job_states import JobStatus
from shared.keys import FAIR_ENDED_SUFFIX
from tests.test_fair_parked import _positions
from tests.test_fair_queuing import KEYS, _config, _enqueue, _job, _lane


async def test_a_job_ended_while_held_counts_ahead_of_no_later_job_of_its_tenant(
    aredis: aioredis.Redis,
) -> None:
    """One job in the stream (a window of 1), three of tenant `a` held; the first cancelled:
    the second's GET still counted it ahead (2: the stream's one and the ended one), where the
    stream's one alone is."""
    config = _config(window=1)
    store, _, stream = await _lane(aredis, config)
    jobs = [_job(config, "x"), *(_job(config, "a") for _ in range(3))]
    assert await _enqueue(store, jobs) == []
    await store.transition(jobs[1].entry.job_id, JobStatus.CANCELLED)
    assert await _positions(aredis, stream, jobs[2:]) == [1, 2]


async def test_ended_places_go_as_refills_take_their_entries_off_the_list(
    aredis: aioredis.Redis,
) -> None:
    """a1..a5 held behind x, a2 and a4 cancelled: a3 and a5 count only the live jobs ahead, as
    reads take x, a1 and a3 (each refill dropping the ended entries it passes), and the set of
    ended places loses each place its refill took off, gone with the tenant's last entry."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    jobs = [_job(config, "x"), *(_job(config, "a") for _ in range(5))]
    assert await _enqueue(store, jobs) == []
    for cancelled in (jobs[2], jobs[4]):
        await store.transition(cancelled.entry.job_id, JobStatus.CANCELLED)
    ended = f"{stream}{FAIR_ENDED_SUFFIX}a"
    assert await _positions(aredis, stream, [jobs[1], jobs[3], jobs[5]]) == [1, 2, 3]
    await reader.take([stream], 1)  # x
    await reader.take([stream], 1)  # a1 moved in and read
    assert await _positions(aredis, stream, [jobs[3], jobs[5]]) == [0, 1]
    await reader.take([stream], 1)  # a2 dropped, a3 moved in and read
    assert await aredis.zrange(ended, 0, -1) == [b"4"]
    assert await _positions(aredis, stream, [jobs[5]]) == [0]
    await reader.take([stream], 1)  # a4 dropped, a5 moved in and read: the list is empty
    assert await aredis.exists(ended) == 0


async def test_a_swept_lists_jobs_count_the_live_jobs_ahead_of_them(
    aredis: aioredis.Redis,
) -> None:
    """A list at its bound (2 x max_length entries) swept of its ended jobs' entries: counted
    from the last entry kept, a3 read none of its tenant's jobs ahead (a1 is), as the places the
    sweep freed behind it were counted ahead of it."""
    config = _config(window=1)
    store, _, stream = await _lane(aredis, config)
    x, a1, a3 = (_job(config, t) for t in ("x", "a", "a"))
    assert await _enqueue(store, [x, a1], max_length=5) == []
    for i in range(2, 11):  # a2, a4..a10 cancelled while held, a3 kept
        job = a3 if i == 3 else _job(config, "a")
        assert await _enqueue(store, [job], max_length=5) == []
        if i != 3:
            await store.transition(job.entry.job_id, JobStatus.CANCELLED)
    a11 = _job(config, "a")
    assert await _enqueue(store, [a11], max_length=5) == []  # swept first
    assert await aredis.llen(KEYS.held(stream, "a")) == 3
    assert await aredis.exists(f"{stream}{FAIR_ENDED_SUFFIX}a") == 0
    assert await _positions(aredis, stream, [a1, a3, a11]) == [1, 2, 3]

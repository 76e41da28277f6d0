"""A fair-queuing tenant's weight is the highest its jobs still held were submitted with: a
raise counts at once, a cut once the heavier jobs ahead of it are served. It was the highest
since the tenant last had nothing held, so a tenant that swapped its weight-3 key for a weight-1
one mid-flood kept weight 3 for as long as its backlog never emptied. Real Valkey, the real TAKE
path."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.job_states import JobStatus
from shared.queue_position import QueuePositions
from tests.test_fair_queuing import KEYS, _config, _enqueue, _job, _lane, _take_tenants


async def test_a_weight_cut_counts_once_the_heavier_jobs_are_served(
    aredis: aioredis.Redis,
) -> None:
    config = _config(window=4)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x") for _ in range(4)])  # the window
    await _enqueue(store, [_job(config, "a", 3.0) for _ in range(6)])
    await _enqueue(store, [_job(config, "b") for _ in range(24)])
    await _enqueue(store, [_job(config, "a", 1.0) for _ in range(24)])  # a's key cut to 1
    fair = KEYS.fair(stream)
    assert await aredis.hget(fair, "w:a") == b"3"  # its weight-3 jobs are still held
    assert await _take_tenants(reader, stream, 4) == ["x"] * 4
    # two rounds at weight 3 serve a's six weight-3 jobs
    assert await _take_tenants(reader, stream, 8) == ["a", "a", "a", "b"] * 2
    assert await aredis.hget(fair, "w:a") == b"1"
    assert await aredis.hget(fair, "wsum") == b"2"
    # c's first job: one round of the ring, a's 1 and b's 1
    assert await QueuePositions(aredis, KEYS).position(stream, None, "c") == 2
    served: list[str] = []
    for _ in range(4):
        served += await _take_tenants(reader, stream, 8)
    assert served.count("a") == served.count("b") == 16, served


async def test_a_raise_counts_at_once_and_a_cut_after_it_waits_for_its_jobs(
    aredis: aioredis.Redis,
) -> None:
    config = _config(window=4)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x") for _ in range(4)])  # the window
    await _enqueue(store, [_job(config, "a") for _ in range(2)])
    await _enqueue(store, [_job(config, "b") for _ in range(30)])
    await _enqueue(store, [_job(config, "a", 3.0) for _ in range(4)])  # raised: at once
    fair = KEYS.fair(stream)
    assert await aredis.hget(fair, "w:a") == b"3"
    assert await aredis.hget(fair, "wsum") == b"4"
    await _enqueue(store, [_job(config, "a", 0.5) for _ in range(12)])  # cut: after those 4
    await _enqueue(store, [_job(config, "a", 2.0) for _ in range(1)])  # over the 0.5 only
    assert await aredis.hget(fair, "w:a") == b"3"
    assert await _take_tenants(reader, stream, 4) == ["x"] * 4
    # a's first six jobs (the two before the raise too) go at weight 3, then it weighs 2 until
    # its weight-2 job, the newest, is served
    assert await _take_tenants(reader, stream, 8) == ["a", "a", "a", "b"] * 2
    assert await aredis.hget(fair, "w:a") == b"2"
    assert await aredis.hget(fair, "wsum") == b"3"
    assert await _take_tenants(reader, stream, 6) == ["a", "a", "b"] * 2


async def test_a_sweep_keeps_a_cut_behind_the_heavier_jobs_it_kept(
    aredis: aioredis.Redis,
) -> None:
    """A sweep (a list at twice max_length) drops the entries of jobs cancelled while held and
    numbers the kept ones again, up to the tenant's last place: the place a cut waits for moves
    with them, or the cut would count while a's weight-3 jobs are still held."""
    config = _config(window=2)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x") for _ in range(2)])  # the window
    await _enqueue(store, [_job(config, "a", 3.0) for _ in range(4)])
    await _enqueue(store, [_job(config, "b") for _ in range(2)])
    for _ in range(20):  # each cancelled while held: its entry stays in a's list
        doomed = _job(config, "a", 1.0)
        assert await _enqueue(store, [doomed], max_length=12) == []  # none refused
        await store.transition(doomed.entry.job_id, JobStatus.CANCELLED)
    # its list at twice max_length: swept of the 20 at the first of these
    assert await _enqueue(store, [_job(config, "a", 1.0) for _ in range(3)], max_length=12) == []
    assert await aredis.llen(KEYS.held(stream, "a")) == 4 + 3
    fair = KEYS.fair(stream)
    assert await _take_tenants(reader, stream, 2) == ["x"] * 2
    assert await _take_tenants(reader, stream, 3) == ["a"] * 3
    assert await aredis.hget(fair, "w:a") == b"3"  # its fourth weight-3 job is still held
    assert await _take_tenants(reader, stream, 4) == ["b", "a", "a", "a"]
    assert await aredis.hget(fair, "w:a") == b"1"
    assert await aredis.hget(fair, "wsum") == b"2"


async def _commands(aredis: aioredis.Redis) -> int:
    stats = await aredis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_"))


async def test_a_held_submit_that_cuts_its_weight_runs_no_command_more(
    aredis: aioredis.Redis,
) -> None:
    """The levels ride on the write of the tenant's place (`n:`) that every held submit makes:
    a submit that opens a lower level costs what one at the tenant's weight does."""
    config = _config(window=2)
    store, _, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "a", 3.0) for _ in range(4)])  # 2 in the stream, 2 held
    costs = []
    for weight in (3.0, 1.0, 1.0):
        await aredis.config_resetstat()
        await _enqueue(store, [_job(config, "a", weight)])
        costs.append(await _commands(aredis))
    assert costs[0] == costs[1] == costs[2], costs
    assert await aredis.hget(KEYS.fair(stream), "c:a") == b"3 1"  # 3 up to its third hold

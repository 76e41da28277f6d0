"""Weighted deficit round robin on a real Valkey, driven as a worker drives it (ENQUEUE through
the job store, TAKE through the worker's reader): what a tenant's credit does when its held
queue empties by cancellation rather than by being served, and what a TAKE costs the server
beside a thousand tenants."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.job_states import JobStatus
from tests.test_fair_queuing import KEYS, _config, _enqueue, _job, _lane, _take_tenants


async def test_a_tenant_whose_held_jobs_were_cancelled_comes_back_with_no_credit(
    aredis: aioredis.Redis,
) -> None:
    """Deficit round robin resets a queue's credit when the queue empties. A tenant whose held
    jobs all ended (cancelled) kept the credit it had saved towards its next job while their
    entries waited in its list for a refill to drop them: at weight 0.25, three turns' worth, so
    the job it sent next went first, ahead of three of the other tenant's, as if it had waited
    all along."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x")])  # the window: everything after it is held
    doomed = _job(config, "a", 0.25)
    await _enqueue(store, [doomed])
    await _enqueue(store, [_job(config, "b") for _ in range(20)])
    assert await _take_tenants(reader, stream, 1) == ["x"]
    assert await _take_tenants(reader, stream, 3) == ["b"] * 3  # a saved 0.75 meanwhile
    await store.transition(doomed.entry.job_id, JobStatus.CANCELLED)

    await _enqueue(store, [_job(config, "a", 0.25)])  # back, its queue emptied in between
    served = await _take_tenants(reader, stream, 4)
    # a fourth turn to a whole credit, as for any tenant of its weight whose queue was empty
    assert served == ["b", "b", "b", "a"], served
    assert await aredis.hget(KEYS.fair(stream), "held") == b"14"  # b's rest


async def _take_commands(aredis: aioredis.Redis, tenants: list[float], count: int) -> list[int]:
    """Commands the scripts ran (INFO commandstats, the calls themselves and INFO left out) in
    each of `count` TAKEs of 8 from a lane holding two jobs of each of `tenants` (weights), the
    first tenant's forty, after the window's read."""
    config = _config(window=4)
    store, reader, stream = await _lane(aredis, config)
    jobs = [
        _job(config, f"t{i}", w) for i, w in enumerate(tenants) for _ in range(40 if i == 0 else 2)
    ]
    await _enqueue(store, jobs)
    await _take_tenants(reader, stream, 4)
    costs = []
    for _ in range(count):
        await aredis.config_resetstat()
        assert len(await _take_tenants(reader, stream, 8)) == 8
        stats = await aredis.info("commandstats")
        outside = {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_info", "cmdstat_config|resetstat"}
        costs.append(sum(s["calls"] for name, s in stats.items() if name not in outside))
    return costs


# Commands per job a TAKE moves in and reads: ~12 (an HMGET of the tenant's credit, an LPOP, the
# job's HMGET, an XADD, its HSET and HDEL, the turn's HSET, LLEN and LMOVE).
PER_JOB = 20


async def test_a_take_beside_a_thousand_tenants_costs_its_batch(aredis: aioredis.Redis) -> None:
    """A turn moves a job of each tenant of weight 1 it visits: eight turns per TAKE of eight,
    however many tenants wait."""
    costs = await _take_commands(aredis, [1.0] * 1_000, 3)
    assert max(costs) < 8 * PER_JOB, costs

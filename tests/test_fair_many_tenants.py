"""Fair queuing with many tenants holding a job or two each (thousands of API keys, one request
apiece): a held job's position, at submit and on a GET, sums the other held tenants' weights, and
that sum is kept in the lane's fair hash, so neither reads each tenant's weight (which made every
held submit O(tenants) on the server, and a burst of one-job tenants O(tenants²))."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.job_states import JobStatus
from shared.queue_position import QueuePositions
from tests.test_fair_queuing import KEYS, _config, _enqueue, _job, _lane

TENANTS = 60


async def _hgets(aredis: aioredis.Redis) -> int:
    stats = await aredis.info("commandstats")
    return int(stats.get("cmdstat_hget", {"calls": 0})["calls"])


async def test_a_held_jobs_position_costs_no_read_per_tenant(aredis: aioredis.Redis) -> None:
    config = _config(window=4)
    store, _, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, f"t{index}") for index in range(4 + TENANTS)])
    await aredis.config_resetstat()
    late = _job(config, "late")
    # the window's 4, then one round of the ring: each other tenant's one job
    assert await store.create(late.entry, stream, late.fields, fair=(4, 1.0)) == 4 + TENANTS
    assert await QueuePositions(aredis, KEYS).position(stream, None, "late") == 4 + TENANTS
    assert await _hgets(aredis) < 20


async def test_the_weight_sum_follows_reweighing_and_tenants_leaving(
    aredis: aioredis.Redis,
) -> None:
    """A heavier key's submit mid-flood counts at once; a tenant served out of the ring no
    longer counts at all."""
    config = _config(window=4)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "a") for _ in range(12)])  # 4 in the stream, 8 held
    await _enqueue(store, [_job(config, "b")])
    await _enqueue(store, [_job(config, "a", 3.0)])  # a's key now weighs 3
    positions = QueuePositions(aredis, KEYS)
    # c's first job: the stream's 4, then a round of the ring: a's 3 and b's 1
    assert await positions.position(stream, None, "c") == 4 + 3 + 1
    await reader.take([stream], 8)  # the 4, then a's 3 and b's 1 moved in and read: b is out
    assert await positions.position(stream, None, "c") == 3
    assert await aredis.hget(KEYS.fair(stream), "wsum") == b"3"
    await reader.take([stream], 20)  # a served out too: nothing held, no sum left
    assert not await aredis.hexists(KEYS.fair(stream), "wsum")


async def test_a_tenants_weight_is_its_highest_keys_whatever_key_submitted_last(
    aredis: aioredis.Redis,
) -> None:
    """Two keys of one tenant with different weights: the tenant weighed whatever its last
    submit's key said, so one job sent with its weight-1 key cut its weight-3 flood to a third
    (and the next weight-3 submit put it back). A tenant's weight is the highest of the keys its
    held jobs were submitted with."""
    config = _config(window=4)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "a", 3.0) for _ in range(12)])  # 4 in the stream, 8 held
    await _enqueue(store, [_job(config, "b") for _ in range(8)])
    await _enqueue(store, [_job(config, "a", 1.0)])  # a's other key
    assert await aredis.hget(KEYS.fair(stream), "w:a") == b"3"
    # c's first job: the stream's 4, then a round of the ring: a's 3 and b's 1
    assert await QueuePositions(aredis, KEYS).position(stream, None, "c") == 4 + 3 + 1
    await reader.take([stream], 4)  # the window's 4
    taken = await reader.take([stream], 8)
    assert taken is not None
    tenants = [d.entry.tenant for d in taken[1] if d.entry]
    assert tenants == ["a", "a", "a", "b"] * 2


async def test_jobs_cancelled_while_held_count_in_no_position(aredis: aioredis.Redis) -> None:
    """A job cancelled while held keeps its entry in its tenant's list until a refill drops it:
    positions counted those entries as the tenant's jobs ahead, and a tenant with only such
    entries as a turn in every round, so a newcomer read 6 instead of 5 here, and the
    cancelling tenant's next job 24 (every job held) instead of 5."""
    config = _config(window=4)
    store, _, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x") for _ in range(4)])  # the window
    await _enqueue(store, [_job(config, "b") for _ in range(20)])
    doomed = [_job(config, "a") for _ in range(10)]
    await _enqueue(store, doomed)
    for job in doomed:
        await store.transition(job.entry.job_id, JobStatus.CANCELLED)
    positions = QueuePositions(aredis, KEYS)
    assert await positions.position(stream, None, "c") == 4 + 1  # b's turn; a has none
    late = _job(config, "a")
    assert await store.create(late.entry, stream, late.fields, fair=(4, 1.0)) == 4 + 1
    assert await positions.position(stream, None, "a") == 4 + 1
    assert await positions.position(stream, None, "c") == 4 + 2  # b's turn, then a's

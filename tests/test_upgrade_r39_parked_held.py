"""A rolling upgrade's fair lane on a real Valkey, beside a release before parked tenants and
held jobs' places (80ccdc1). A tenant a newer refill parked out of the ring (`fair:parked`) is
invisible to the older refill, which, finding the ring empty, wrote the lane's `held` count 0
while the parked tenant's jobs were still held: a newer refill, trusting that count, never
moved them, and they sat queued (position 0) until they expired, with every worker upgraded.
And jobs an older producer held carry no place (`hseq`) and count in no `n:`: a newer
producer's job held behind them was numbered its tenant's first, its position read as if none
of them were ahead."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from tests.test_fair_parked import _positions
from tests.test_fair_queuing import KEYS, _config, _enqueue, _job, _lane, _take_tenants


async def test_a_parked_tenants_jobs_move_after_an_older_refill_zeroed_the_held_count(
    aredis: aioredis.Redis,
) -> None:
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x")])  # the window: everything after it is held
    await _enqueue(store, [_job(config, "a") for _ in range(2)])
    await _enqueue(store, [_job(config, "b", 0.1) for _ in range(3)])
    assert await _take_tenants(reader, stream, 1) == ["x"]
    assert await _take_tenants(reader, stream, 2) == ["a", "a"]  # b parked after its first turn
    assert await aredis.zrange(KEYS.fair_parked(stream), 0, -1) == [b"b"]
    assert await aredis.llen(KEYS.fair_ring(stream)) == 0
    assert await aredis.hget(KEYS.fair(stream), "held") == b"3"

    # What 80ccdc1's refill (shared/job_scripts.py) writes on this lane: its ring empty,
    # `if not tenant then left = 0; break end`, then
    # `redis.call('HSET', fair, 'held', math.max(left, 0))`.
    await aredis.hset(KEYS.fair(stream), "held", 0)

    assert await _take_tenants(reader, stream, 3) == ["b", "b", "b"]
    assert await aredis.hget(KEYS.fair(stream), "held") == b"0"
    assert await aredis.llen(KEYS.held(stream, "b")) == 0
    assert await aredis.zcard(KEYS.fair_parked(stream)) == 0


async def test_an_idle_lanes_due_that_names_no_parked_tenant_goes(aredis: aioredis.Redis) -> None:
    """A `due` left with no tenant parked (an older refill zeroed `held` as above, and the
    tenant left the set since) would make every read of the idle lane count its lists again:
    the first such count drops it."""
    config = _config(window=1)
    _, reader, stream = await _lane(aredis, config)
    await aredis.hset(KEYS.fair(stream), mapping={"held": 0, "due": 7})
    assert await reader.take([stream], 1) is None  # nothing held, nothing to take
    assert await aredis.hget(KEYS.fair(stream), "due") is None


@pytest.mark.parametrize("left_n", [None, b"1"])
async def test_a_job_held_behind_an_older_producers_holds_counts_them_ahead(
    aredis: aioredis.Redis, left_n: bytes | None
) -> None:
    """`left_n`: the tenant's `n:` before the older holds: none, or one an older refill left
    when it emptied the list (80ccdc1's `leave` drops `d:` and `e:` only)."""
    config = _config(window=1)
    store, _, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x")])  # the window: everything after it is held
    older = [_job(config, "a") for _ in range(3)]
    await _enqueue(store, older)
    # As 80ccdc1's ENQUEUE held them: its record_weight wrote `w:` and `wsum`, no `n:`, and
    # its `redis.call('HSET', jk, mark, value, 'entry', eid or '', ...)` no `hseq`.
    await aredis.hdel(KEYS.fair(stream), "n:a")
    if left_n is not None:
        await aredis.hset(KEYS.fair(stream), "n:a", left_n)
    for job in older:
        await aredis.hdel(KEYS.job(job.entry.job_id), "hseq")

    newer = [_job(config, "a") for _ in range(2)]
    await _enqueue(store, newer)
    # x undelivered, then the three older holds, then each newer one's tenant's before it
    assert await _positions(aredis, stream, newer) == [4, 5]

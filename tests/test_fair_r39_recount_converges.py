"""A fair lane whose parked tenant's held jobs all ended while held, on a real Valkey: its `held`
count reads 0 with the tenant still parked (`due`), the state in which a refill counts the held
jobs again off the tenants' lists (a rolling upgrade's zeroed count, see
test_upgrade_r39_parked_held.py). Finding none, the recount left that state as it was, and
every refill after it (each TAKE of the lane, each FINISH that refills it) counted again, until
a job was held on the lane again. The recount clears the parked tenants with no live entry, as
a sweep clears a tenant with nothing kept, so the next refill reads no `due` and counts
nothing; the tenant's next job is held and served as any newcomer's."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.codec import as_text
from shared.job_states import JobStatus
from shared.job_store import JobStore
from shared.keys import FAIR_ENDED_SUFFIX, UNCOUNTED_SUFFIX
from tests.test_fair_queuing import KEYS, _config, _enqueue, _job, _lane, _take_tenants
from workers.partition.stream_reader import StreamReader

# What a recount runs: the ring's and the parked set's reads, then a length per tenant's list.
RECOUNT_COMMANDS = ("cmdstat_lrange", "cmdstat_zrange", "cmdstat_llen")


async def _recount_calls(aredis: aioredis.Redis) -> int:
    """The recount's commands the server ran since its stats were last reset."""
    stats = await aredis.info("commandstats")
    return sum(stats[name]["calls"] for name in RECOUNT_COMMANDS if name in stats)


async def _left_over(aredis: aioredis.Redis, stream: str, *tenants: str) -> list[str]:
    """The lane's fair hash's fields of `tenants` (`w:b`, `e:b`, ...) and its `due`: none once
    they left the lane."""
    fields = [as_text(name) for name in await aredis.hkeys(KEYS.fair(stream))]
    return [name for name in fields if name == "due" or name.partition(":")[2] in tenants]


async def _park_and_cancel(
    aredis: aioredis.Redis, store: JobStore, reader: StreamReader, stream: str
) -> None:
    """Leave tenant b parked with its three held jobs cancelled (TRANSITION: `held` 0, `e:b`
    3, their entries still in its list), a's two jobs and the window's taken."""
    config = _config(window=1)
    await _enqueue(store, [_job(config, "x")])  # the window: everything after it is held
    await _enqueue(store, [_job(config, "a") for _ in range(2)])
    doomed = [_job(config, "b", 0.1) for _ in range(3)]
    await _enqueue(store, doomed)
    assert await _take_tenants(reader, stream, 1) == ["x"]
    assert await _take_tenants(reader, stream, 2) == ["a", "a"]  # b parked after its first turn
    assert await aredis.zrange(KEYS.fair_parked(stream), 0, -1) == [b"b"]
    for job in doomed:
        await store.transition(job.entry.job_id, JobStatus.CANCELLED)
    assert await aredis.hmget(KEYS.fair(stream), "held", "e:b") == [b"0", b"3"]
    assert await aredis.hget(KEYS.fair(stream), "due") is not None


async def test_a_recount_that_finds_nothing_held_is_not_made_again(
    aredis: aioredis.Redis,
) -> None:
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    await _park_and_cancel(aredis, store, reader, stream)
    assert await reader.take([stream], 4) is None  # the recount: nothing held

    for _ in range(3):  # each a TAKE of the idle lane, as a worker's loop makes them
        await aredis.config_resetstat()
        assert await reader.take([stream], 4) is None
        assert await _recount_calls(aredis) == 0

    # b is gone from the lane as a tenant with nothing left held goes: nothing of it left over
    assert await _left_over(aredis, stream, "b") == []
    assert await aredis.zcard(KEYS.fair_parked(stream)) == 0
    assert (
        await aredis.exists(
            KEYS.held(stream, "b"), stream + FAIR_ENDED_SUFFIX + "b", stream + UNCOUNTED_SUFFIX
        )
        == 0
    )


async def test_the_cleared_tenants_next_job_is_held_and_served(aredis: aioredis.Redis) -> None:
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    await _park_and_cancel(aredis, store, reader, stream)
    assert await reader.take([stream], 4) is None  # the recount clears b

    await _enqueue(store, [_job(config, "y")])  # the window again
    back = _job(config, "b", 0.1)
    await _enqueue(store, [back])
    assert await aredis.hmget(KEYS.job(back.entry.job_id), "held", "hseq") == [b"1", b"1"]
    assert await aredis.hmget(KEYS.fair(stream), "held", "w:b", "wsum") == [b"1", b"0.1", b"0.1"]
    assert await _take_tenants(reader, stream, 4) == ["y", "b"]
    assert await aredis.hget(KEYS.fair(stream), "held") == b"0"
    assert await aredis.exists(KEYS.held(stream, "b"), KEYS.fair_ring(stream)) == 0


async def test_a_recount_sweeps_the_emptied_parked_tenant_and_moves_the_others_job(
    aredis: aioredis.Redis,
) -> None:
    """A rolling upgrade's zeroed count (test_upgrade_r39_parked_held.py) beside a parked tenant
    whose jobs all ended: the recount counts the other's live job, which moves, and sweeps it
    (parked for a later round than the other's, it stayed parked, its lane recounted by every
    refill once the other's job had moved)."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x")])  # the window: everything after it is held
    await _enqueue(store, [_job(config, "a") for _ in range(2)])
    doomed = [_job(config, "b", 0.1) for _ in range(3)]
    await _enqueue(store, doomed)
    await _enqueue(store, [_job(config, "c", 0.2)])  # parked for round 5, b for round 10
    assert await _take_tenants(reader, stream, 1) == ["x"]
    assert await _take_tenants(reader, stream, 2) == ["a", "a"]
    assert await aredis.zrange(KEYS.fair_parked(stream), 0, -1) == [b"c", b"b"]
    for job in doomed:
        await store.transition(job.entry.job_id, JobStatus.CANCELLED)
    await aredis.hset(KEYS.fair(stream), "held", 0)  # what 80ccdc1's refill writes here

    assert await _take_tenants(reader, stream, 4) == ["c"]
    assert await aredis.hget(KEYS.fair(stream), "held") == b"0"
    assert await _left_over(aredis, stream, "b", "c") == []
    assert await aredis.zcard(KEYS.fair_parked(stream)) == 0
    assert await aredis.exists(KEYS.held(stream, "b"), stream + UNCOUNTED_SUFFIX) == 0

"""A fair lane's tenants on a real Valkey, driven as a worker drives the lane (ENQUEUE through
the job store, TAKE through the worker's reader): a tenant many rounds short of a whole credit
is parked out of the ring until its round comes, keeps its deficit round robin share, costs a
TAKE nothing while it waits, and still shows among the lane's held jobs; a held job's position
counts its tenant's jobs ahead of it, not those held after it."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import as_text
from shared.job_states import JobStatus
from shared.job_store import NewJob
from shared.queue_position import QueuePositions
from tests.test_fair_queuing import KEYS, _config, _enqueue, _job, _lane, _take_tenants
from tests.test_fair_r11_drr import PER_JOB, _take_commands


async def test_parked_tenants_keep_their_deficit_round_robin_shares(
    aredis: aioredis.Redis,
) -> None:
    """In forty rounds a tenant of weight 1 moves forty jobs, one of 0.25 ten and one of 0.1
    four, as when every round visited them: a round short (or one too many) in the credit a
    parked tenant gets back would move its jobs a round late (or early)."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x")])  # the window: everything after it is held
    for tenant, weight in (("a", 1.0), ("b", 0.25), ("c", 0.1)):
        await _enqueue(store, [_job(config, tenant, weight) for _ in range(60)])
    assert await _take_tenants(reader, stream, 1) == ["x"]
    served: list[str] = []
    for _ in range(6):
        served += await _take_tenants(reader, stream, 9)
    assert [served.count(tenant) for tenant in "abc"] == [40, 10, 4], served
    # both wait for their next round (44 and 50), out of the ring
    assert await aredis.zrange(KEYS.fair_parked(stream), 0, -1, withscores=True) == [
        (b"b", 44.0),
        (b"c", 50.0),
    ]
    assert await aredis.lrange(KEYS.fair_ring(stream), 0, -1) == [b"a"]
    held = aredis.register_script(job_scripts.HELD_IDS)
    listed = {as_text(job_id) for job_id in await held(keys=[stream], args=[1_000])}
    assert len(listed) == 20 + 50 + 56  # the console lists the parked tenants' held jobs too


async def test_a_take_beside_a_thousand_light_tenants_costs_its_batch(
    aredis: aioredis.Redis,
) -> None:
    """999 tenants of weight 0.001 beside one of weight 1: each round visited all of them to add
    a thousandth of a credit, some 48,000 commands per TAKE of eight. Parked after their first
    turn, they cost the TAKEs after it what a lone tenant's would."""
    costs = await _take_commands(aredis, [1.0] + [0.001] * 999, 3)
    assert costs[0] < 999 * PER_JOB, costs  # the first turn of each, which parks it
    assert max(costs[1:]) < 8 * PER_JOB, costs


async def test_a_parked_tenant_whose_weight_rises_is_served_in_the_next_round(
    aredis: aioredis.Redis,
) -> None:
    """Parked at 0.01 for the 99 rounds its weight needed, a tenant that submits with a key of
    weight 1 goes back to the ring, not waiting those rounds out."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x")])
    await _enqueue(store, [_job(config, "a") for _ in range(20)])
    await _enqueue(store, [_job(config, "b", 0.01)])
    assert await _take_tenants(reader, stream, 1) == ["x"]
    assert await _take_tenants(reader, stream, 2) == ["a", "a"]
    assert await aredis.zscore(KEYS.fair_parked(stream), "b") == 100.0

    await _enqueue(store, [_job(config, "b", 1.0)])
    assert await aredis.zcard(KEYS.fair_parked(stream)) == 0
    assert await _take_tenants(reader, stream, 3) == ["a", "b", "a"]


async def _positions(aredis: aioredis.Redis, stream: str, jobs: list[NewJob]) -> list[int]:
    """Each job's position as GET /v1/jobs/{id} reads it (QueueEta.of: its hash's fields)."""
    positions = QueuePositions(aredis, KEYS)
    read = []
    for job in jobs:
        fields = {
            as_text(k): as_text(v)
            for k, v in (await aredis.hgetall(KEYS.job(job.entry.job_id))).items()
        }
        seq = int(fields["seq"]) if "seq" in fields else None
        read.append(await positions.position(stream, seq, "a", fields.get("hseq")))
    return read


async def test_a_held_jobs_position_grows_with_no_job_its_tenant_holds_after_it(
    aredis: aioredis.Redis,
) -> None:
    """Counted as its tenant's last held job, each held job read the position of the last:
    six read 0 to 5 on their 202s and 0, 5, 5, 5, 5, 5 on GET. Counted by its place among its
    tenant's holds, each reads its own, and one nearer as entries ahead of it leave the list."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    jobs = [_job(config, "a") for _ in range(7)]
    assert await _enqueue(store, jobs) == []  # the first in the stream (its window), six held
    assert await _positions(aredis, stream, jobs) == [0, 1, 2, 3, 4, 5, 6]
    await store.transition(jobs[2].entry.job_id, JobStatus.CANCELLED)  # its entry stays, ended
    # a job that ended while held counts ahead of none of its tenant's later jobs
    assert await _positions(aredis, stream, jobs[3:]) == [2, 3, 4, 5]
    assert len(await _take_tenants(reader, stream, 3)) == 3  # the first, then two moved in
    assert await _positions(aredis, stream, jobs[4:]) == [0, 1, 2]

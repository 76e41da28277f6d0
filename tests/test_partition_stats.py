"""What `read_partition_stats` reports of a lane (the console's overview, the metrics gauges,
`GET /v1/models`), on a real Valkey."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, ModelRepository
from shared.partition_stats import read_partition_stats

KEYS = Keys("ps:")
FAIR = KEYS.queue("m", "default")


async def test_lag_counts_the_undelivered_entries_after_out_of_order_acks(
    aredis: aioredis.Redis,
) -> None:
    """Jobs finish out of order (micro-batches side by side, reclaims), and every acknowledged
    entry is deleted: XINFO's `lag` then reads null, and the console and the lag gauge showed 0
    while entries waited. Lag is XLEN - pending: here 5 waiting, 1 in flight."""
    config = ModelConfig(name="m", kind="batch", backend="identity")
    stream = KEYS.queue("m", "default")
    await aredis.xgroup_create(stream, GROUP, "0", mkstream=True)
    _, second = [await aredis.xadd(stream, {"n": n}) for n in range(2)]
    await aredis.xreadgroup(GROUP, "c1", {stream: ">"})
    await aredis.xack(stream, GROUP, second)  # the later one ends first
    await aredis.xdel(stream, second)
    for n in range(5):
        await aredis.xadd(stream, {"n": n})
    [stats] = await read_partition_stats(aredis, KEYS, ModelRepository({"m": config}))
    groups = await aredis.xinfo_groups(stream)
    assert groups[0]["lag"] is None  # what the lag once shown was read from
    assert (stats.online.lag, stats.online.pending, stats.online.length) == (5, 1, 6)


def _repository() -> ModelRepository:
    return ModelRepository({"m": ModelConfig(name="m", kind="batch", backend="identity")})


async def _fair_flood(client: aioredis.Redis, jobs: list[tuple[str, float]]) -> list[str]:
    """Jobs of (tenant, seconds since submitted) on a fair lane of window 1, in order: the
    stream takes the first, the round robin holds back the rest. Their ids."""
    await client.xgroup_create(FAIR, GROUP, "0", mkstream=True)
    fields: dict[str, str | int] = {"model": "m", "variant": "default"}
    entries = [
        RequestEntry(uuid.uuid4().hex, {}, now_ms() - age_s * 1000, tenant=tenant)
        for tenant, age_s in jobs
    ]
    await JobStore(client, KEYS, 600).create_many([NewJob(e, FAIR, fields, 1) for e in entries])
    return [entry.job_id for entry in entries]


async def test_held_jobs_count_in_the_lag_and_the_oldest_age(aredis: aioredis.Redis) -> None:
    """A fair lane's flood waits held back, outside its stream (one entry at most there, none
    once a worker read it): the lag gauge read 0 and the oldest-age gauge 0 while 39 jobs had
    waited a minute, so neither alert fired on a backlog building."""
    await _fair_flood(aredis, [("a", 60)] * 30 + [("b", 60)] * 10)
    await aredis.xreadgroup(GROUP, "w-1", {FAIR: ">"})
    [stats] = await read_partition_stats(aredis, KEYS, _repository())
    assert (stats.online.held, stats.online.pending, stats.online.length) == (39, 1, 40)
    assert stats.online.lag == 39
    assert 59 <= stats.online.oldest_age_s < 120


async def test_the_oldest_age_is_the_jobs_wait_not_its_entrys(aredis: aioredis.Redis) -> None:
    """An entry the round robin moves into the stream is appended then, under a new id: its wait
    began when the job was submitted, which the entry carries (`enq`)."""
    await _fair_flood(aredis, [("a", 60)])
    [stats] = await read_partition_stats(aredis, KEYS, _repository())
    assert (stats.online.held, stats.online.lag) == (0, 1)
    assert 59 <= stats.online.oldest_age_s < 120


async def test_a_held_job_that_ended_is_no_oldest(aredis: aioredis.Redis) -> None:
    """A job cancelled while held leaves its entry in its tenant's list until a refill drops
    it: the oldest age is that of the jobs still waiting, not of one gone."""
    _, cancelled, _ = await _fair_flood(aredis, [("a", 600), ("a", 600), ("b", 60)])
    await aredis.xreadgroup(GROUP, "w-1", {FAIR: ">"})
    await JobStore(aredis, KEYS, 600).transition(cancelled, JobStatus.CANCELLED)
    [stats] = await read_partition_stats(aredis, KEYS, _repository())
    assert (stats.online.held, stats.online.lag) == (1, 1)
    assert 59 <= stats.online.oldest_age_s < 120


async def test_the_oldest_age_reads_no_entry_per_held_tenant(aredis: aioredis.Redis) -> None:
    """Thousands of one-job tenants held: every `GET /v1/models` and metrics read ran one LRANGE
    per tenant inside Redis (O(tenants), milliseconds of a blocked server at thousands). The held
    jobs are kept by submit time, so the read is O(log held)."""
    tenants = 200
    ages = [(f"t{index}", 60.0 - index / 10) for index in range(tenants)]
    await _fair_flood(aredis, [("first", 600.0), *ages])
    await aredis.xreadgroup(GROUP, "w-1", {FAIR: ">"})
    await aredis.config_resetstat()
    [stats] = await read_partition_stats(aredis, KEYS, _repository())
    assert stats.online.held == tenants
    assert 59 <= stats.online.oldest_age_s < 120
    counts = await aredis.info("commandstats")
    assert sum(int(c["calls"]) for c in counts.values()) < 40, counts

"""The per-key in-flight cap, the per-variant experiment counters and the console's job list
on a real Valkey Cluster (#12): tenants, models and partitions whose keys live on different
masters, job hashes in their partitions' slots, and every script touching only the keys it
declares (a cluster refuses anything else)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from conveyor.valkey_cluster import LocalCluster
from producer_api.console.job_browser import JobFilter, recent_jobs
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelConfig, ModelRepository
from shared.rate_limit import InFlightLimiter
from shared.redis_client import RedisClient
from shared.stats_window import BUCKET_S, bucket_of
from shared.variant_stats import VariantStats
from workers.partition.finished_stats import FinishedStats

pytestmark = pytest.mark.slow
KEYS = Keys()
CAP = 3


@pytest.fixture
def client(cluster_client: RedisClient) -> RedisClient:
    return cluster_client


def _one_per_master(cluster: LocalCluster, key: Callable[[str], str], stem: str) -> list[str]:
    """Names (`stem` + n) whose `key` lands on each master in turn: one name per master."""
    chosen: dict[int, str] = {}
    for n in range(1_000):
        chosen.setdefault(cluster.master_of(key(f"{stem}{n}")).port, f"{stem}{n}")
        if len(chosen) == len(cluster.masters):
            return list(chosen.values())
    raise LookupError("no spread found")


async def test_in_flight_cap_admits_refuses_and_prunes_ended_jobs_per_tenant(
    cluster: LocalCluster, client: RedisClient
) -> None:
    tenants = _one_per_master(cluster, KEYS.in_flight, "key-")
    limiter = InFlightLimiter(client, KEYS, ttl_s=60)
    partitions = [("m", f"v{n}") for n in range(8)]
    for tenant in tenants:
        jobs = [new_job_id(*partitions[n % len(partitions)]) for n in range(CAP + 2)]
        owners = {cluster.master_of(KEYS.job(job)).port for job in jobs}
        assert len(owners) > 1  # the set's members are job hashes on other masters
        assert [await limiter.admit(tenant, job, CAP) for job in jobs[:CAP]] == [True] * CAP
        assert not await limiter.admit(tenant, jobs[CAP], CAP)  # none ended, none stale
        await client.hset(KEYS.job(jobs[0]), "status", "succeeded")  # no ZREM: a lost removal
        await client.hset(KEYS.job(jobs[1]), "status", "running")
        assert await limiter.admit(tenant, jobs[CAP], CAP)  # the ended job was pruned
        assert not await limiter.admit(tenant, jobs[CAP + 1], CAP)
        held = await client.zmscore(KEYS.in_flight(tenant), jobs)
        assert [score is not None for score in held] == [False, True, True, True, False]
    hasty = InFlightLimiter(client, KEYS, ttl_s=60)
    hasty.GRACE_MS = 0  # jobs without a hash are submits that died at once
    last = tenants[-1]
    assert await hasty.admit(last, new_job_id("m", "v0"), CAP)
    assert await client.zcard(KEYS.in_flight(last)) == 2  # the running job and the new one


async def test_variant_stats_record_and_sum_on_the_models_masters(
    cluster: LocalCluster, client: RedisClient
) -> None:
    models = _one_per_master(cluster, lambda m: KEYS.variant_stats(m, "a"), "model-")
    stats = VariantStats(client, KEYS)
    now = time.time()
    finished = [
        {
            "model": model,
            "variant": variant,
            "status": "succeeded" if n % 4 else "failed",
            "created": "1000",
            "started": str(1000 + n),
            "finished": str(1000 + 2 * n),
        }
        for model in models
        for variant in ("a", "b")
        for n in range(1, 9)
    ]
    recorder = FinishedStats(stats)  # what a worker's write-back records finished jobs through
    recorder.add(finished)
    await recorder.close()
    earlier = bucket_of(now) - 3  # a bucket written half a minute ago: the sum spans buckets
    await client.hincrbyfloat(f"{KEYS.variant_stats(models[0], 'b')}{earlier}", "requests", 5)
    await stats.add_counts(models[1], "a", {"shadow_pairs": 1, "shadow_agree": 1})
    for model in models:
        windows = await stats.window(model, ["a", "b"], now - 6 * BUCKET_S)
        for variant, window in windows.items():
            extra = 5 if (model, variant) == (models[0], "b") else 0
            assert (window.requests, window.errors) == (8 + extra, 2)
            assert sorted(s.service_ms for s in window.samples) == [float(n) for n in range(1, 9)]
    shadowed = await stats.window(models[1], ["a"], now - BUCKET_S)
    assert shadowed["a"].counters["shadow_agree"] == 1


async def test_console_lists_jobs_of_partitions_on_every_master(
    cluster: LocalCluster, client: RedisClient
) -> None:
    models = _one_per_master(cluster, lambda m: KEYS.queue(m, "default"), "model-")
    repository = ModelRepository(
        {m: ModelConfig(name=m, kind="batch", backend="identity") for m in models}
    )
    written: list[tuple[str, str, str]] = []  # (job id, model, status), oldest first
    for model in models:
        for status, key in (
            ("queued", KEYS.queue(model, "default")),  # its entry waits in the lane
            ("succeeded", KEYS.recent(KEYS.bulk_queue(model, "default"))),  # ended there
            ("failed", KEYS.dlq(model, "default")),  # dead-lettered
        ):
            job = new_job_id(model, "default")
            created = len(written)
            await client.hset(
                KEYS.job(job), mapping={"status": status, "model": model, "created": created}
            )
            if status == "succeeded":
                await client.lpush(key, job)
            else:
                await client.xadd(key, {"id": job})
            written.append((job, model, status))
    everything = await recent_jobs(client, KEYS, repository, JobFilter())
    assert [row["id"] for row in everything] == [job for job, *_ in reversed(written)]
    wanted = JobFilter(status="failed", model=models[1])
    failed = await recent_jobs(client, KEYS, repository, wanted)
    assert [row["id"] for row in failed] == [
        job for job, model, status in written if (model, status) == (models[1], "failed")
    ]

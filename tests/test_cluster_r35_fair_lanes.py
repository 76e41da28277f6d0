"""Fair lanes and dead letters on a real Valkey Cluster: their scripts (ENQUEUE holding jobs
back, POSITION of a held job, TRANSITION cancelling one, TAKE refilling the stream by round
robin, the console's HELD_IDS; RECLAIM dead-lettering a job, REPLAY_LETTER enqueuing it again)
touch keys they build from the lane's stream and its entries' job ids, which a cluster refuses
where such a key lives on another master. Until now they ran on one server only, where every
key is local. One partition per master, each with jobs of real (tagged) ids."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.valkey_cluster import LocalCluster
from producer_api.console.job_browser import JobFilter, recent_jobs
from shared.codec import RequestEntry, as_text
from shared.dead_letters import DeadLetters
from shared.job_states import JobStatus
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelConfig, ModelRepository, QueueLimits
from shared.queue_position import QueuePositions
from shared.redis_client import RedisClient
from tests.test_cluster_control_plane import _one_per_master
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.stream_reader import StreamReader

pytestmark = pytest.mark.slow
KEYS = Keys()
VARIANT = "default"
TENANTS = ("a", "b", "c")


def _config(model: str) -> ModelConfig:
    queue = QueueLimits(fair=True, fair_window=1, visibility_timeout_s=30)
    return ModelConfig(name=model, kind="batch", backend="identity", queue=queue)


def _one_model_per_master(cluster: LocalCluster, stem: str) -> list[str]:
    return _one_per_master(cluster, lambda model: KEYS.queue(model, VARIANT), stem)


def _job(model: str, tenant: str) -> NewJob:
    entry = RequestEntry(new_job_id(model, VARIANT), {"inputs": {}}, now_ms(), tenant=tenant)
    fields: dict[str, str | int] = {"model": model, "variant": VARIANT}
    return NewJob(entry, KEYS.queue(model, VARIANT), fields, 1, 1.0)


async def test_fair_lanes_hold_place_cancel_list_and_refill_on_every_master(
    cluster: LocalCluster, cluster_client: RedisClient
) -> None:
    models = _one_model_per_master(cluster, "fair-")
    repository = ModelRepository({model: _config(model) for model in models})
    store, positions = JobStore(cluster_client, KEYS, 60), QueuePositions(cluster_client, KEYS)
    for model in models:
        stream = KEYS.queue(model, VARIANT)
        jobs = [_job(model, tenant) for tenant in TENANTS for _ in range(2)]
        assert await store.create_many(jobs) == []
        # the window's one job in the stream, the rest held: c's first behind it and a round
        place = await cluster_client.hget(KEYS.job(jobs[4].entry.job_id), "hseq")
        assert await positions.position(stream, None, "c", as_text(place)) == 3
        doomed = jobs[1].entry.job_id  # a's second, held
        await store.transition(doomed, JobStatus.CANCELLED)
        reader = StreamReader(cluster_client, KEYS, [stream], "r35-worker")
        await reader.ensure_groups()
        console = await recent_jobs(cluster_client, KEYS, repository, JobFilter(model=model))
        listed = {row["id"] for row in console}
        assert {job.entry.job_id for job in jobs} - {doomed} <= listed
        seen: list[str] = []
        while (taken := await reader.take([stream], 1)) is not None:
            seen += [delivery.entry.tenant for delivery in taken[1] if delivery.entry]
        assert seen == ["a", "b", "c", "b", "c"]  # round robin, the cancelled one never read
        assert await cluster_client.hget(KEYS.fair(stream), "held") == b"0"


async def test_a_job_dead_lettered_on_any_master_is_replayed_there(
    cluster: LocalCluster, cluster_client: RedisClient
) -> None:
    store = JobStore(cluster_client, KEYS, 60)
    for model in _one_model_per_master(cluster, "dead-"):
        limits = QueueLimits(visibility_timeout_s=0.05, max_deliveries=1)
        config = ModelConfig(name=model, kind="batch", backend="identity", queue=limits)
        partition = Partition.of(KEYS, config, VARIANT)
        job = _job(model, "a")
        await store.create(job.entry, partition.online, job.fields)
        dying = StreamReader(cluster_client, KEYS, partition.streams, "r35-dies")
        await dying.ensure_groups()
        assert await dying.take([partition.online], 1)
        await asyncio.sleep(0.1)  # past the visibility timeout: it died with the job
        events = JobEvents("redis://unused")
        reclaimer = Reclaimer(cluster_client, KEYS, partition, "r35-reclaims", 60, events)
        assert await reclaimer.reclaim(partition.online) == []  # dead-lettered
        assert await cluster_client.hget(KEYS.job(job.entry.job_id), "status") == b"failed"
        letters = DeadLetters(store, KEYS, model, VARIANT)
        [(dead, replayed)] = (await letters.replay()).replayed
        assert dead == job.entry.job_id
        assert await cluster_client.hget(KEYS.job(replayed), "status") == b"queued"
        assert await letters.depth() == 0

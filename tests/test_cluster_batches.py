"""Batch API progress on a real Valkey Cluster (#12): a batch whose items sit in partitions
served by three different masters is counted in each partition's slot, applied to the batch's
hash once however many producers look at it together, finalized by exactly one of them, and
cancelled across masters. Items are enqueued as the Batch API does; no worker runs them here
(the full-stack cluster tests do): the test writes their terminal status into their job hashes
as a worker's FINISH would."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.crc import key_slot

from conveyor.valkey_cluster import LocalCluster
from producer_api.batch_api.progress import BatchApiProgress
from producer_api.batch_api.sweeper import COMPLETE_AFTER_MS, BatchApiSweeper
from shared.batch_api_store import BatchApiStore, BatchStatus, open_lists
from shared.codec import RequestEntry
from shared.file_store import FileStore, StoredFile
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import Keys, new_job_id
from shared.redis_client import RedisClient
from shared.settings import get_settings
from shared.webhook_events import WebhookDispatcher
from tests.test_cluster_client import _waits

pytestmark = pytest.mark.slow
KEYS = Keys()
MODEL = "identity"
TTL_S = 600
LOOKERS = 8  # producers refreshing one batch at once


@pytest.fixture
def client(cluster_client: RedisClient) -> RedisClient:
    return cluster_client


def _variants(cluster: LocalCluster) -> list[str]:
    """One variant of MODEL per master: its partition's keys land there."""
    chosen: dict[int, str] = {}
    for n in range(1_000):
        master = cluster.master_of(KEYS.queue(MODEL, f"v{n}"))
        chosen.setdefault(master.port, f"v{n}")
        if len(chosen) == len(cluster.masters):
            return list(chosen.values())
    raise LookupError("no spread found")


async def _submit(
    cluster: LocalCluster, store: BatchApiStore, jobs: JobStore, per_variant: int
) -> tuple[str, dict[str, list[str]]]:
    """A running batch of `per_variant` items in each of three partitions on three masters,
    lines interleaved across them as a batch file's are; returns its id and item ids by
    variant, in stream order."""
    batch_id = f"batch_{uuid.uuid4().hex}"
    variants = _variants(cluster)
    owners = {cluster.master_of(KEYS.batch_open(batch_id, MODEL, v)).port for v in variants}
    assert owners == {master.port for master in cluster.masters}
    ids = {v: [new_job_id(MODEL, v) for _ in range(per_variant)] for v in variants}
    for v in variants:  # each item list is in the slot of its items' job hashes
        slots = {key_slot(KEYS.job(job_id).encode()) for job_id in ids[v]}
        assert slots == {key_slot(KEYS.batch_open(batch_id, MODEL, v).encode())}
    lines = [(ids[v][n], v) for n in range(per_variant) for v in variants]
    await store.create(batch_id, {"tenant": "default", "total": len(lines)}, TTL_S)
    new_jobs = [
        NewJob(
            RequestEntry(job_id, {"inputs": {"n": line}}, now_ms()),
            KEYS.bulk_queue(MODEL, v),
            {"model": MODEL, "variant": v, "batch": batch_id, "line": line},
        )
        for line, (job_id, v) in enumerate(lines, start=1)
    ]
    assert await jobs.create_many(new_jobs) == []  # as BatchApiService enqueues
    items = [(job_id, KEYS.batch_open(batch_id, MODEL, v)) for job_id, v in lines]
    await store.add_items(batch_id, items, [], TTL_S)
    lists = sorted({open_list for _, open_list in items})
    await store.start(batch_id, lists, len(items), {"invalid": 0}, now_ms() + TTL_S * 1000)
    return batch_id, ids


async def _end(client: RedisClient, status: str, job_ids: list[str]) -> None:
    """What a worker's FINISH writes into each job hash, in its partition's slot."""
    for job_id in job_ids:
        await client.hset(KEYS.job(job_id), mapping={"status": status, "finished": now_ms()})


def _services(client: RedisClient) -> tuple[BatchApiStore, JobStore, BatchApiProgress]:
    store = BatchApiStore(client, KEYS, TTL_S)
    jobs = JobStore(client, KEYS, TTL_S)
    return store, jobs, BatchApiProgress(jobs, store, WebhookDispatcher("redis://unused"))


async def test_progress_over_three_masters_counts_once_and_finalizes_once(
    cluster: LocalCluster, client: RedisClient
) -> None:
    store, jobs, progress = _services(client)
    batch_id, ids = await _submit(cluster, store, jobs, per_variant=40)
    for items in ids.values():
        await _end(client, "succeeded", items[:15] + items[25:30])  # 25-29: out of order
        await _end(client, "failed", items[15:20])

    # Every looker counts the same items from the same cursors: one count is applied.
    looks = await asyncio.gather(*(progress.refresh(batch_id, 256) for _ in range(LOOKERS)))
    for look in looks:
        assert look is not None and look.fields["status"] == "in_progress"
        assert look.counts == {"succeeded": 60, "failed": 15, "cancelled": 0, "expired": 0}
    fields = await store.read(batch_id)
    assert fields is not None  # stragglers are shown, counted for good once their head ends
    assert (fields["n_succeeded"], fields["n_failed"], fields["open"]) == ("45", "15", "60")

    for items in ids.values():
        await _end(client, "succeeded", items[20:25] + items[30:])
    looks = await asyncio.gather(*(progress.refresh(batch_id, 256) for _ in range(LOOKERS)))
    assert sum(look.finalize for look in looks if look is not None) == 1
    fields = await store.read(batch_id)
    assert fields is not None and fields["status"] == "completed"
    assert (fields["n_succeeded"], fields["n_failed"], fields["open"]) == ("105", "15", "0")
    assert [await client.exists(key) for key in open_lists(fields)] == [0, 0, 0]
    assert await client.zscore(KEYS.batches_active, batch_id) is None
    again = await progress.refresh(batch_id, 256)
    assert again is not None and not again.finalize and again.counts["succeeded"] == 105

    # A finalizer that died after the batch's commit left it indexed: a sweep drops it (once
    # the commit is older than a live finalizer could still be completing it).
    await client.zadd(KEYS.batches_active, {batch_id: now_ms() + TTL_S * 1000})
    await store.set_fields(batch_id, {"completed_at": now_ms() - COMPLETE_AFTER_MS})
    await BatchApiSweeper(store, progress).sweep()
    assert await client.zscore(KEYS.batches_active, batch_id) is None


async def test_cancel_settles_every_partition_and_ends_the_batch(
    cluster: LocalCluster, client: RedisClient
) -> None:
    store, jobs, progress = _services(client)
    batch_id, ids = await _submit(cluster, store, jobs, per_variant=10)
    for items in ids.values():
        await _end(client, "succeeded", items[:3])

    assert await progress.end(batch_id, BatchStatus.CANCELLED) == BatchStatus.CANCELLED
    fields = await store.read(batch_id)
    assert fields is not None and fields["status"] == "cancelled"
    assert (fields["n_succeeded"], fields["n_cancelled"]) == ("9", "21")
    for items in ids.values():
        statuses = [(await jobs.get(job_id)) for job_id in items]
        assert [record.fields["status"] for record in statuses if record] == (
            ["succeeded"] * 3 + ["cancelled"] * 7
        )
    assert await progress.end(batch_id, BatchStatus.CANCELLED) is None


async def test_input_files_and_the_tenant_index_work_across_masters(
    cluster: LocalCluster, client: RedisClient
) -> None:
    """Each uploaded file is a key of its own slot (spread over the masters); a tenant's file
    and batch indexes are keys of the control plane's."""
    files = FileStore(client, KEYS, TTL_S)
    ids = [f"file-{uuid.uuid4().hex}" for _ in range(20)]
    for n, file_id in enumerate(ids):
        await files.put(file_id, {"tenant": "acme", "bytes": "5"}, f"{n}\n".encode())
    assert len({cluster.master_of(KEYS.file(file_id)).port for file_id in ids}) > 1
    assert await files.data(ids[7]) == StoredFile("acme", "", b"7\n")
    assert await files.fields_many([ids[7]]) == [{"tenant": "acme", "bytes": "5"}]
    assert set(await files.listed("acme", None, 50)) == set(ids)  # one index, every master's
    await files.delete(ids[7])
    assert await files.data(ids[7]) is None and await files.fields_many([ids[7]]) == [None]
    listed = await files.page("acme", None, 50, files.fields_many)
    assert {file_id for file_id, _ in listed.found} == set(ids) - {ids[7]} and not listed.more
    assert set(await files.listed("acme", None, 50)) == set(ids) - {ids[7]}  # the page dropped it
    newest = await files.listed("acme", None, 5)
    assert await files.listed("acme", newest[2], 2) == newest[3:5]  # a page after an id: a script

    store = _services(client)[0]
    batches = [f"batch_{uuid.uuid4().hex}" for _ in range(3)]
    for batch_id in batches:
        await store.enlist("acme", batch_id)
        await asyncio.sleep(0.002)  # scored by the ms each was created in
    assert await store.listed("acme", None, 2) == batches[:0:-1]
    assert await store.listed("acme", batches[1], 5) == batches[:1]
    await store.unlist("acme", [batches[0]])
    assert await store.listed("acme", None, 5) == batches[:0:-1]


async def test_a_batchs_writes_wait_for_the_replicas_of_every_master_they_reach(
    cluster: LocalCluster, client: RedisClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `CONVEYOR_REPLICA_ACKS` a batch's items, their lists and its start are confirmed
    by the replicas of each master that holds them: its items sit on all three."""
    monkeypatch.setenv("CONVEYOR_REPLICA_ACKS", "1")
    get_settings.cache_clear()
    for node in cluster.masters:
        node.client().config_resetstat()
    store, jobs, _ = _services(client)
    try:
        batch_id, _ = await _submit(cluster, store, jobs, per_variant=3)
    finally:
        get_settings.cache_clear()
    assert all(calls > 0 for calls in _waits(cluster).values()), _waits(cluster)
    fields = await store.read(batch_id)
    assert fields is not None and fields["status"] == "in_progress"

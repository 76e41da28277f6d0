"""Resharding under a running client (#12): while a slot migrates (`CLUSTER SETSLOT …
MIGRATING/IMPORTING` and `MIGRATE`, as `valkey-cli --cluster reshard` does), a key already
moved is answered ASK by the old master and served by the importing one, whose connection
must carry ASKING: on a busy client's node pool too, and on a master added since the client
read the slots (rebalancing onto a new master). A script is not sent on by ASK (it would read
job hashes still on the old master as missing), and what a moving slot refuses (TRYAGAIN,
redirects without end) is an outage: a 503, a worker's backoff. A job script that meets a key
moved ahead of those it declares goes on without it (a job handed over unmarked, a held entry
put back), and a write-back runs on the old master while the keys it declares are there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import TryAgainError

from conveyor.valkey_cluster import ClusterNode, LocalCluster
from shared import batch_api_scripts, job_scripts
from shared.codec import RequestEntry
from shared.file_store import FileStore
from shared.job_states import JobStatus
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import GROUP, Keys, new_job_id
from shared.model_repository import ModelConfig, ModelRepository, Variant
from shared.partition_stats import read_partition_stats
from shared.redis_client import RedisClient, call_script, connect
from workers.partition.finish import Finish
from workers.partition.job_events import JobEvents
from workers.partition.redis_backoff import OUTAGE
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import Delivery, StreamReader

pytestmark = pytest.mark.slow
KEYS = Keys()
# More idle connections than redis-py's redirect budget (16 tries, two per ASK and MOVED)
IDLE_CONNECTIONS = 12


@pytest.fixture
async def busy(cluster: LocalCluster) -> AsyncIterator[RedisClient]:
    """A cluster client as the processes make it (`connect`), its pools empty."""
    client = connect(
        f"redis://127.0.0.1:{cluster.masters[0].port}/0", name="resharding", cluster=True
    )
    yield client
    await client.aclose()


@contextmanager
def migrating(slot: int, source: ClusterNode, target: ClusterNode) -> Iterator[None]:
    """`slot` mid-migration from `source` to `target`; stable on both again on the way out."""
    moves = ((target, "IMPORTING", source.node_id), (source, "MIGRATING", target.node_id))
    for node, state, peer in moves:
        with node.client() as admin:
            admin.execute_command("CLUSTER SETSLOT", slot, state, peer)
    try:
        yield
    finally:
        for node, *_ in moves:
            with node.client() as admin:
                admin.execute_command("CLUSTER SETSLOT", slot, "STABLE")


def migrate(key: str, source: ClusterNode, target: ClusterNode) -> None:
    """Move one key as `valkey-cli --cluster reshard` does, the slot already migrating."""
    with source.client() as admin:
        admin.execute_command("MIGRATE", "127.0.0.1", target.port, key, 0, 5000)


def hand_over(cluster: LocalCluster, slot: int, source: ClusterNode, target: ClusterNode) -> None:
    """End the migration: the slot's remaining keys moved, then the slot given to `target`
    on every master, as `valkey-cli --cluster reshard` ends it."""
    with source.client() as admin:
        if keys := admin.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000):
            admin.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
    others = [node for node in cluster.masters if node not in (source, target)]
    for node in (target, source, *others):
        with node.client() as admin:
            admin.execute_command("CLUSTER SETSLOT", slot, "NODE", target.node_id)


def held_by(node: ClusterNode, key: str) -> bytes | None:
    """`key`'s value on `node`, an importing master that serves it only after ASKING."""
    with redis.Redis(port=node.port, single_connection_client=True) as admin:
        admin.execute_command("ASKING")
        return admin.get(key)


async def _idle_connections(client: RedisClient, node: ClusterNode, count: int) -> None:
    """Leave `count` idle connections in the client's pool of `node`, as a busy process has."""
    probe = f"probe:{node.port}"
    await asyncio.gather(
        *(
            client.execute_command("ECHO", probe, target_nodes=_known(client, node))
            for _ in range(count)
        )
    )


def _known(client: RedisClient, node: ClusterNode) -> object:
    return client.get_node(host="127.0.0.1", port=node.port)  # type: ignore[attr-defined]


def _new_job(variant: str, fair_window: int = 0, enq_ms: int | None = None) -> NewJob:
    entry = RequestEntry(new_job_id("resharded", variant), {"inputs": {}}, enq_ms or now_ms())
    stream = KEYS.queue("resharded", variant)
    return NewJob(entry, stream, {"model": "resharded"}, fair_window=fair_window)


async def _taken(reader: StreamReader, lane: str) -> list[str]:
    """The ids of the jobs one TAKE of `lane` hands over."""
    batch = await reader.take([lane], 10)
    return [d.entry.job_id for d in batch[1] if d.entry] if batch else []


def _done(delivery: Delivery) -> Finish:
    """The result of a job run."""
    assert delivery.entry is not None
    fields = {"outputs": "{}", "finished": str(now_ms())}
    return Finish(delivery.entry_id, delivery.entry.job_id, status="succeeded", fields=fields)


def _other_master(cluster: LocalCluster, source: ClusterNode) -> ClusterNode:
    return next(node for node in cluster.masters if node.port != source.port)


def _move_of(cluster: LocalCluster, key: str) -> tuple[int, ClusterNode, ClusterNode]:
    """`key`'s slot, the master that holds it and another master to move it to."""
    source = cluster.master_of(key)
    return key_slot(key.encode()), source, _other_master(cluster, source)


async def _queued(
    busy: RedisClient, jobs: list[NewJob], consumer: str, mark_on_read: bool = False
) -> StreamReader:
    """`jobs` enqueued on their lane, and a reader of it as `consumer`, its group made."""
    reader = StreamReader(busy, KEYS, [jobs[0].stream], consumer, mark_on_read=mark_on_read)
    await reader.ensure_groups()
    assert await JobStore(busy, KEYS, 60).create_many(jobs) == []
    return reader


async def test_a_migrated_job_is_read_from_the_importing_master_by_a_busy_client(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """A job whose hash migrated before its stream is read where it went (GET /v1/jobs/{id}
    mid-reshard). redis-py sent ASKING on one idle connection and the read on another: the
    importing master answered MOVED, the old one ASK again, until "TTL exhausted"."""
    store = JobStore(busy, KEYS, 60)
    job = _new_job("read")
    assert await store.create_many([job]) == []
    key = KEYS.job(job.entry.job_id)
    slot, source, target = _move_of(cluster, key)
    await _idle_connections(busy, target, IDLE_CONNECTIONS)
    with migrating(slot, source, target):
        migrate(key, source, target)
        record = await store.get(job.entry.job_id)
        assert record is not None and record.status == JobStatus.QUEUED


async def test_a_write_to_a_migrating_slot_lands_on_a_master_added_since(
    cluster: LocalCluster, busy: RedisClient, tmp_path: Path
) -> None:
    """Rebalancing onto a new master: the client read the slots before it joined, so the ASK
    names a node it does not know. redis-py looked it up as None (an AttributeError); the
    write now goes there, with ASKING on its connection."""
    key = "cv:test:{rebalanced}"
    assert await busy.get(key) is None  # the slots read, the new master not among them
    source = cluster.master_of(key)
    added = cluster.add_master(tmp_path / "added")
    with migrating(key_slot(key.encode()), source, added):
        assert await busy.set(key, "moved") is True
        assert held_by(added, key) == b"moved"


async def test_a_submit_while_its_partitions_keys_move_is_an_outage(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """A job hash moved, its lane's stream not yet: ENQUEUE's keys are split between the two
    masters, answered TRYAGAIN until the rest moves. redis-py gave up with a bare ClusterError
    (a 500); it is the outage a moving slot is (503, Retry-After; a worker backs off)."""
    store = JobStore(busy, KEYS, 60)
    first, late = _new_job("submit"), _new_job("submit")
    assert await store.create_many([first]) == []
    key = KEYS.job(first.entry.job_id)
    slot, source, target = _move_of(cluster, key)
    with migrating(slot, source, target):
        migrate(key, source, target)
        with pytest.raises(TryAgainError):
            await store.create(late.entry, late.stream, late.fields)


async def test_a_worker_takes_no_job_of_a_lane_moved_ahead_of_its_jobs(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """A lane's stream moved, its job hashes not yet: the old master sent TAKE on by ASK, and
    on the importing master its jobs' hashes, not keys TAKE declares, read as missing, so the
    worker dropped every entry it took as a job gone (each accepted job lost). The read now
    waits for the slot as an outage, and the jobs are taken, queued, once it has moved."""
    jobs = [_new_job("take") for _ in range(3)]
    lane = jobs[0].stream
    reader = await _queued(busy, jobs, "w-resharding")
    slot, source, target = _move_of(cluster, lane)
    with migrating(slot, source, target):
        migrate(lane, source, target)
        with pytest.raises(TryAgainError):
            await reader.take([lane], 10)
        hand_over(cluster, slot, source, target)
        batch = await reader.take([lane], 10)
    assert batch is not None
    assert {(d.entry.job_id, d.status) for d in batch[1] if d.entry} == {
        (job.entry.job_id, JobStatus.QUEUED) for job in jobs
    }


async def test_a_transaction_to_a_slot_mid_migration_is_an_outage(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """An uploaded file's first write, a MULTI, to a slot mid-migration: redis-py takes the
    old master's ASK for a MOVED and sends no ASKING, so the two masters sent it back and forth
    until a MovedError came out, a 500. It is the outage a moving slot is (503, Retry-After)."""
    files = FileStore(busy, KEYS, 60)
    key = KEYS.file("file-resharded")
    assert await busy.exists(key) == 0  # the slots read
    slot, source, target = _move_of(cluster, key)
    with migrating(slot, source, target), pytest.raises(TryAgainError):
        await files.put("file-resharded", {"tenant": "t-resharding"}, b"line")


async def test_a_workers_read_that_meets_a_moved_job_hands_it_over_at_once(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """A job hash moved, its fair lane's stream not yet: TAKE runs on the old master, took the
    entries (XREADGROUP) and then failed on the moved hash, a key it does not declare, so the
    entries sat in the worker's pending list, run by nobody until claimed back a delivery more
    or a visibility timeout later. The moved job is handed over with the rest, unmarked (taken
    as queued, as a blocking read's entries are), each entry at its first delivery."""
    jobs = [_new_job("refused", fair_window=2) for _ in range(3)]  # the third held: a fair hash
    lane = jobs[0].stream
    reader = await _queued(busy, jobs, "w-refused")
    slot, source, target = _move_of(cluster, lane)
    with migrating(slot, source, target):
        migrate(KEYS.job(jobs[0].entry.job_id), source, target)
        batch = await reader.take([lane], 10)
        pending = await busy.xpending_range(lane, GROUP, "-", "+", 10, consumername="w-refused")
    assert batch is not None
    assert {(d.entry.job_id, d.status) for d in batch[1] if d.entry} == {
        (job.entry.job_id, JobStatus.QUEUED) for job in jobs
    }
    assert [row["times_delivered"] for row in pending] == [1, 1, 1]


async def test_a_held_job_moved_ahead_of_its_lane_stays_held(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """A fair lane's held job whose hash moved before the lane: a refill popped its entry off
    the tenant's list, then failed on the hash (not a key it declares), and the job was never
    run. The refill puts it back and stops; the job is moved in once the slot has moved."""
    jobs = [_new_job("held", fair_window=1) for _ in range(3)]  # the first in, two held
    lane = jobs[0].stream
    reader = await _queued(busy, jobs, "w-held")
    slot, source, target = _move_of(cluster, lane)
    taken: list[str] = []
    with migrating(slot, source, target):
        migrate(KEYS.job(jobs[1].entry.job_id), source, target)
        with suppress(OUTAGE):
            taken += await _taken(reader, lane)
        hand_over(cluster, slot, source, target)
    while more := await _taken(reader, lane):
        taken += more
    assert sorted(taken) == sorted(job.entry.job_id for job in jobs)


async def test_a_write_back_goes_on_while_its_keys_have_not_moved(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """FINISH declared this second's drained counter, which does not exist until the second's
    first write-back: every write-back was refused (TRYAGAIN) from the start of a migration of
    its slot to its end. It runs on the old master while the keys it writes are all there, and
    one whose job hash has moved ahead is refused whole, nothing written."""
    jobs = [_new_job("written") for _ in range(2)]
    lane = jobs[0].stream
    reader = await _queued(busy, jobs, "w-written")
    batch = await reader.take([lane], 10)
    assert batch is not None
    here, moved = (_done(d) for d in batch[1])
    writer = ResultWriter(busy, KEYS, 60, JobEvents("redis://unused"), "w-written")
    slot, source, target = _move_of(cluster, lane)
    with migrating(slot, source, target):
        assert [f.job_id for f in await writer.finish(lane, [here])] == [here.job_id]
        migrate(KEYS.job(moved.job_id), source, target)
        with pytest.raises(OUTAGE):
            await writer.finish(lane, [moved])
        assert [
            row["message_id"] for row in await busy.xpending_range(lane, GROUP, "-", "+", 10)
        ] == [moved.entry_id]


async def test_a_reclaim_that_meets_a_moved_job_hands_its_entry_over(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """An abandoned entry whose job hash moved before its lane: RECLAIM took it over
    (XAUTOCLAIM) and then failed on the hash, a key it does not declare, so the entry sat with
    the reclaiming consumer for a visibility timeout more. It is handed over, unmarked."""
    store = JobStore(busy, KEYS, 60)
    job = _new_job("reclaimed")
    lane, dlq = job.stream, KEYS.dlq("resharded", "reclaimed")
    abandoning = StreamReader(busy, KEYS, [lane], "w-abandoning")
    await abandoning.ensure_groups()
    assert await store.create_many([job]) == []
    assert await abandoning.take([lane], 10) is not None
    await busy.xadd(dlq, {"an": "earlier dead letter"})
    reclaim = busy.register_script(job_scripts.RECLAIM)
    args = [GROUP, "w-reclaiming", 0, 10, KEYS.job_prefix, now_ms(), 3, 60, KEYS.token_prefix, 60]
    slot, source, target = _move_of(cluster, lane)
    with migrating(slot, source, target):
        migrate(KEYS.job(job.entry.job_id), source, target)
        rows = await call_script(reclaim, [lane, dlq], args)
    assert [(status, deliveries) for _, _, status, deliveries in rows] == [(b"queued", 2)]


async def test_a_generate_read_hands_over_jobs_it_cannot_mark_mid_migration(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """A generate loop marks the jobs a blocking read hands it running (MARK_RUNNING, which
    declares their hashes): one hash moved ahead of its lane, the mark was refused (TRYAGAIN)
    after the read had handed the entries over, and every retry claimed them back a delivery
    more until the slot had moved. They are handed over unmarked, at their first delivery."""
    jobs = [_new_job("generated") for _ in range(2)]
    lane = jobs[0].stream
    reader = await _queued(busy, jobs, "w-generating", mark_on_read=True)
    slot, source, target = _move_of(cluster, lane)
    with migrating(slot, source, target):
        migrate(KEYS.job(jobs[0].entry.job_id), source, target)
        batches = await reader.wait([lane], 10, None)
    assert sorted((d.entry.job_id, d.status) for _, got in batches for d in got if d.entry) == (
        sorted((job.entry.job_id, JobStatus.QUEUED) for job in jobs)
    )


async def test_a_cancel_refused_mid_migration_leaves_the_held_count_alone(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """Cancelling a job a fair lane holds while its lane's slot migrates, the lane's set of
    uncounted jobs not there yet: TRANSITION took the job off the held count, then was refused
    the set, so every retry of the cancel took it off again (the lane admitted as many jobs
    more past max_length). Refused first, the set, nothing is written until the cancel runs."""
    store = JobStore(busy, KEYS, 60)
    jobs = [_new_job("cancelled", fair_window=1) for _ in range(2)]  # the second held
    lane, held = jobs[0].stream, jobs[1].entry.job_id
    assert await store.create_many(jobs) == []
    slot, source, target = _move_of(cluster, lane)
    with migrating(slot, source, target):
        for _ in range(2):
            with pytest.raises(OUTAGE):
                await store.transition(held, JobStatus.CANCELLED)
        hand_over(cluster, slot, source, target)
    assert (await store.transition(held, JobStatus.CANCELLED)).status == JobStatus.CANCELLED
    assert await busy.hget(KEYS.fair(lane), "held") == b"0"


async def test_queue_stats_read_a_held_job_moved_ahead_of_its_lane_as_waiting(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """OLDEST (GET /v1/models, the oldest-age gauge) read the hash of each tenant's first held
    job, a key it does not declare: moved ahead of the lane, the script failed, /v1/models was
    a 503 and the metrics kept stale values for the whole migration. A held entry whose hash is
    not here is taken as waiting (the usual case: an ended one is dropped by the next refill)."""
    jobs = [_new_job("oldest", fair_window=1, enq_ms=enq) for enq in (now_ms(), 1, now_ms())]
    lane = jobs[0].stream  # the first in, the oldest and the last held
    await StreamReader(busy, KEYS, [lane], "w-oldest").ensure_groups()
    assert await JobStore(busy, KEYS, 60).create_many(jobs) == []
    config = ModelConfig(
        name="resharded",
        kind="batch",
        backend="identity",
        variants={"oldest": Variant()},
        default_variant="oldest",
    )
    slot, source = key_slot(lane.encode()), cluster.master_of(lane)
    with migrating(slot, source, target := _other_master(cluster, source)):
        migrate(KEYS.job(jobs[1].entry.job_id), source, target)
        [stats] = await read_partition_stats(busy, KEYS, ModelRepository({"resharded": config}))
    assert stats.online.lag == 3 and stats.online.oldest_age_s == pytest.approx(now_ms() / 1000)


async def test_a_batch_count_stops_at_an_item_moved_ahead_of_its_list(
    cluster: LocalCluster, busy: RedisClient
) -> None:
    """COUNT (a batch's GET, its progress) read each item's job hash, a key it does not declare:
    one moved ahead of the partition's item list failed the script, a 503 for the batch until
    the slot had moved. The count stops at it (counted once it can be read), never as expired."""
    jobs = [_new_job("counted") for _ in range(3)]
    assert await JobStore(busy, KEYS, 60).create_many(jobs) == []
    items = KEYS.batch_open("b-resharded", "resharded", "counted")
    await busy.rpush(items, *(job.entry.job_id for job in jobs))
    for job in jobs:
        await busy.hset(KEYS.job(job.entry.job_id), "status", "succeeded")
    count = busy.register_script(batch_api_scripts.COUNT)
    slot, source = key_slot(items.encode()), cluster.master_of(items)
    with migrating(slot, source, target := _other_master(cluster, source)):
        migrate(KEYS.job(jobs[1].entry.job_id), source, target)
        at, more, *tallies = await call_script(count, [items], [KEYS.job_prefix, 0, 100, 5])
    states = batch_api_scripts.ITEM_STATES
    one_succeeded = [int(state == "succeeded") for state in states]
    assert (at, more) == (1, 0)
    assert tallies == one_succeeded + one_succeeded  # the first counted, the third seen

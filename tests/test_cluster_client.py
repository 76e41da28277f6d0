"""The cluster client's own duties on a real Valkey Cluster (#12).

With `CONVEYOR_REPLICA_ACKS`, a group-commit flush waits for the replicas of the masters it wrote
to, and only theirs: a flush of reads waits for none, and a WAIT that falls short fails only the
writes to its master, so one shard that lost its replicas never fails another shard's reads or
writes (those sharing a flush with its writes wait as long as it). Scripts a node lost (it
restarted since the processes loaded them) still run, pipelined or group-committed. Lanes on
several masters have their drain rates read in one go. And every node's connections pack
commands with hiredis, as a single server's do. A process starts on the seed nodes it is given
while the URL's node is down. A slot that resharding moved is followed by a
pipeline with a WAIT, group-committed or not, and its WAIT goes to the slot's new master."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from redis._parsers.encoders import Encoder
from redis.crc import key_slot
from redis.exceptions import TryAgainError

from conveyor.stack import free_port
from conveyor.valkey_cluster import ClusterNode, LocalCluster, local_cluster
from producer_api.app import create_app
from producer_api.jobs.group_commit import group_committing
from producer_api.reply_listener import ReplyListener
from shared.celery_broker import BROKER_TAG, broker_app
from shared.codec import RequestEntry, dumps
from shared.drain_rate import drain_rates
from shared.job_states import JobStatus
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import Keys, new_job_id
from shared.redis_client import HiredisPacking, RedisClient, ReplicaAckTimeout, connect
from shared.settings import get_settings
from tests.app_client import app_client
from tests.conftest import until, until_async
from workers import webhook_delivery
from workers.partition.stream_reader import StreamReader

pytestmark = pytest.mark.slow
KEYS = Keys()
PARTITIONS = (("identity", "default"), ("identity", "canary"))


@pytest.fixture
def one_ack(cluster: LocalCluster, settings_env: Callable[..., None]) -> str:
    """The cluster's URL, every client `connect` makes in the test waiting for one replica."""
    settings_env(CONVEYOR_REDIS_CLUSTER="1", CONVEYOR_REPLICA_ACKS="1")
    return f"redis://127.0.0.1:{cluster.masters[0].port}/0"


@pytest.fixture
async def acked(cluster_client: RedisClient, one_ack: str) -> AsyncIterator[RedisClient]:
    """A group-committing cluster client whose writes wait for one replica."""
    client = group_committing(cluster_client, one_ack, "group-commit-test")
    yield client
    await client.aclose()


def _waits(cluster: LocalCluster) -> dict[int, int]:
    """WAIT calls each master served since its stats were reset."""
    stats = {node.port: node.client().info("commandstats") for node in cluster.masters}
    return {port: int(info.get("cmdstat_wait", {}).get("calls", 0)) for port, info in stats.items()}


async def test_a_flush_waits_on_the_masters_it_wrote_to_only(
    cluster: LocalCluster, acked: RedisClient
) -> None:
    written, read = "cv:test:{a}", "cv:test:{b}"
    assert cluster.master_of(written).port != cluster.master_of(read).port
    for node in cluster.masters:
        node.client().config_resetstat()

    await asyncio.gather(acked.set(written, 1), acked.get(read))  # one flush: one write
    after_write = _waits(cluster)
    assert await acked.get(written) == b"1"  # a flush of reads
    after_read = _waits(cluster)

    wrote_to = cluster.master_of(written).port
    assert after_write == {node.port: int(node.port == wrote_to) for node in cluster.masters}
    assert after_read == after_write


async def test_a_master_without_replicas_fails_its_own_writes_only(
    tmp_path: Path, settings_env: Callable[..., None]
) -> None:
    """A flush that writes to a master with no replica left, and reads a key of another master:
    the WAIT on the first falls short and fails the write, and the read gets its value. It
    failed too (one short WAIT failed the whole flush): a producer answered every request 503
    while one shard lacked its replicas, not only the submits to that shard's partitions."""
    timeout = {"CONVEYOR_REDIS_TIMEOUT_S": "0.5"}
    settings_env(CONVEYOR_REDIS_CLUSTER="1", CONVEYOR_REPLICA_ACKS="1", **timeout)
    written, read = "cv:test:{a}", "cv:test:{b}"
    with local_cluster(tmp_path, replicas=0) as bare:
        assert bare.master_of(written).port != bare.master_of(read).port
        bare.master_of(read).client().set(read, "value")
        url = f"redis://127.0.0.1:{bare.masters[0].port}/0"
        plain = connect(url, name="bare", blocks_ms=0)  # as the producer's
        hot = group_committing(plain, url, "bare-hot")
        try:
            wrote, got = await asyncio.gather(
                hot.set(written, 1), hot.get(read), return_exceptions=True
            )
        finally:
            await hot.aclose()
            await plain.aclose()
    assert isinstance(wrote, ReplicaAckTimeout), repr(wrote)
    assert got == b"value"


def _forget_scripts(cluster: LocalCluster) -> None:
    """As if every node had restarted since the processes loaded their scripts."""
    for node in cluster.masters + cluster.replicas:
        node.client().script_flush()


def _new_job(model: str, variant: str) -> NewJob:
    entry = RequestEntry(new_job_id(model, variant), {"inputs": {}}, now_ms())
    return NewJob(entry, KEYS.queue(model, variant), {"model": model, "variant": variant})


async def test_scripts_a_node_lost_still_run(
    cluster: LocalCluster, cluster_client: RedisClient, acked: RedisClient
) -> None:
    store, hot = JobStore(cluster_client, KEYS, 60), JobStore(acked, KEYS, 60)
    jobs = [_new_job(*partition) for partition in PARTITIONS]
    _forget_scripts(cluster)
    assert await store.create_many(jobs) == []  # pipelined, on two masters
    _forget_scripts(cluster)
    late = _new_job(*PARTITIONS[0])
    assert await hot.create(late.entry, late.stream, late.fields) == 1  # group-committed
    _forget_scripts(cluster)
    ids = [job.entry.job_id for job in [*jobs, late]]
    assert await store.settle_many(ids, JobStatus.CANCELLED, {}) == 3  # pipelined
    records = await store.get_many(ids)
    assert [r.status if r else None for r in records] == [JobStatus.CANCELLED] * 3
    other = _new_job(*PARTITIONS[1])
    assert await store.create_many([other]) == []
    _forget_scripts(cluster)
    cancelled = await store.transition(other.entry.job_id, JobStatus.CANCELLED)  # beside a ZREM
    assert cancelled.status == JobStatus.CANCELLED


async def test_drain_rates_of_lanes_on_several_masters(
    cluster: LocalCluster, cluster_client: RedisClient
) -> None:
    lanes = [KEYS.queue(*partition) for partition in PARTITIONS]
    assert cluster.master_of(lanes[0]).port != cluster.master_of(lanes[1]).port
    second = int(time.time())
    counts = {(lanes[0], second - 3): 10, (lanes[0], second): 5, (lanes[1], second - 1): 20}
    for (lane, at), count in counts.items():
        await cluster_client.set(KEYS.drained(lane, at), count)
    first, other = await drain_rates(cluster_client, KEYS, lanes, 5)
    assert 15 / 6 <= first <= 15 / 5  # over five seconds and the part of this one gone by
    assert other == pytest.approx(first * 20 / 15)


@pytest.mark.parametrize("group_commit", [False, True])
async def test_every_nodes_connections_pack_with_hiredis(
    cluster: LocalCluster,
    cluster_client: RedisClient,
    monkeypatch: pytest.MonkeyPatch,
    group_commit: bool,
) -> None:
    """Packing in C is a tenth of a producer's CPU per job; a cluster client used to pack in
    Python. What reaches each master is what redis-py's own encoder would send."""
    url = f"redis://127.0.0.1:{cluster.masters[0].port}/0"
    monkeypatch.setenv("CONVEYOR_REDIS_CLUSTER", "1")
    get_settings.cache_clear()
    plain = connect(url, name="packing-test", blocks_ms=0)
    client = group_committing(plain, url, "packing-test") if group_commit else plain
    values: list[str | bytes | int | float] = ["héllo ✓", b"\x00\r\n", 2**63, -3.5e-7]
    keys = [f"cv:test:{{{tag}}}" for tag in ("a", "b", "c", "d")]
    try:
        assert len({cluster.master_of(key).port for key in keys}) == 3
        async with client.pipeline(transaction=False) as pipe:
            for key, value in zip(keys, values, strict=True):
                pipe.set(key, value)
            await pipe.execute()
        assert await plain.execute_command("CONFIG GET", "maxmemory", target_nodes="all")
        encoder = Encoder("utf-8", "strict", False)
        assert [await client.get(key) for key in keys] == [encoder.encode(v) for v in values]
        for node in client.get_nodes():  # type: ignore[attr-defined]
            connection = node.acquire_connection()
            assert isinstance(connection, HiredisPacking), node.name
            node.release(connection)
    finally:
        if group_commit:
            await client.aclose()
        await plain.aclose()
        get_settings.cache_clear()


async def test_the_reply_listener_follows_a_channel_whose_slot_moves(
    tmp_path: Path, settings_env: Callable[..., None]
) -> None:
    """Resharding moves a reply channel's slot to another master: the old one unsubscribes the
    listener (a `sunsubscribe` nobody asked for) and keeps the connection open, so no error
    ever said to subscribe again, and every waiter of that partition sat out its whole wait."""
    settings_env(CONVEYOR_REDIS_CLUSTER="1")
    with local_cluster(tmp_path, replicas=0) as moving:
        client = connect(f"redis://127.0.0.1:{moving.masters[0].port}/0")
        await client.ping()  # knows the slots, as a producer's does once started
        listener = ReplyListener(client, KEYS, "p1", JobStore(client, KEYS, 60))
        try:
            job_id = new_job_id("identity", "default")
            waiting = await listener.register(job_id)
            channel = listener.channel(job_id)
            source = moving.master_of(channel)
            target = next(node for node in moving.masters if node.port != source.port)
            slot, target_id = key_slot(channel.encode()), target.client().cluster("MYID")
            for node in (target, source):  # an empty slot: handed over without MIGRATE
                node.client().execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
            view = {"id": job_id, "status": "succeeded"}
            with target.client() as owner:  # a message published before it listens is lost

                async def resubscribed() -> bool:
                    [(_, count)] = owner.pubsub_shardnumsub(channel)
                    return bool(count == 1)

                await until_async(resubscribed, timeout=10)  # on the new owner
                assert owner.execute_command("SPUBLISH", channel, dumps([view])) == 1
            assert (await asyncio.wait_for(waiting, 10))["status"] == "succeeded"
        finally:
            await listener.stop()
            await client.aclose()


async def test_a_generate_workers_read_marks_its_jobs_running_on_any_master(
    cluster: LocalCluster, cluster_client: RedisClient
) -> None:
    """MARK_RUNNING named no key, so a cluster client sent it to a random node, which refused
    the partition's job hashes as keys of another node: two reads in three ended a generate
    worker (it marks every read). Each call now goes to its partition's master."""
    store = JobStore(cluster_client, KEYS, 60)
    for model, variant in PARTITIONS:
        lane = KEYS.queue(model, variant)
        await cluster_client.delete(lane)  # other tests' entries
        reader = StreamReader(cluster_client, KEYS, [lane], "w-1", mark_on_read=True)
        await reader.ensure_groups()
        jobs = [_new_job(model, variant) for _ in range(6)]
        for job in jobs:  # one read, one MARK_RUNNING call each
            assert await store.create_many([job]) == []
            [(stream, [delivery])] = await reader.wait([lane], 1, 100)
            assert (stream, delivery.status) == (lane, JobStatus.RUNNING)
        records = await store.get_many([job.entry.job_id for job in jobs])
        assert {(r.status, r.fields["worker"]) for r in records if r} == {
            (JobStatus.RUNNING, "w-1")
        }


def _owner(node: ClusterNode, slot: int) -> int:
    """The port of the master `node` says serves `slot`."""
    with node.client() as viewer:
        for start, end, master, *_ in viewer.execute_command("CLUSTER SLOTS"):
            if int(start) <= slot <= int(end):
                return int(master[1])
    raise LookupError(f"node {node.port} knows no master of slot {slot}")


def _reshard(cluster: LocalCluster, key: str) -> ClusterNode:
    """Give `key`'s slot (empty: handed over without MIGRATE) to another master, as online
    resharding does, and wait until every node names it; returns the new master. The nodes'
    stats are reset, for `_waits`."""
    slot, source = key_slot(key.encode()), cluster.master_of(key)
    target = next(node for node in cluster.masters if node.port != source.port)
    others = [node for node in cluster.masters if node not in (source, target)]
    for node in (target, source, *others):
        with node.client() as admin:
            admin.execute_command("CLUSTER SETSLOT", slot, "NODE", target.node_id)
    with target.client() as admin:
        admin.execute_command("CLUSTER BUMPEPOCH")  # its claim wins every node's view
    nodes = cluster.masters + cluster.replicas
    until(lambda: all(_owner(node, slot) == target.port for node in nodes), timeout=20)
    for node in cluster.masters:
        with node.client() as admin:
            admin.config_resetstat()
    return target


async def test_a_flush_follows_a_slot_that_moved(cluster: LocalCluster, acked: RedisClient) -> None:
    """A write whose slot moved since the client read the slots is answered MOVED. redis-py
    sent it again through the client's `execute_command`, which queued it into another flush,
    sent to the same node (a pipeline never read the slots again): MOVED again, forever, and
    every later submit to that partition hung. It now lands on the new master, its WAIT
    there."""
    key = "cv:test:{resharded-flush}"
    assert await acked.get(key) is None  # the slots read, as a running producer has them
    target = _reshard(cluster, key)
    assert await asyncio.wait_for(acked.set(key, 1), 10)
    with target.client() as owner:
        assert owner.get(key) == b"1"
    assert _waits(cluster)[target.port] == 1


async def test_a_flush_to_a_slot_mid_migration_is_an_outage(
    cluster: LocalCluster, acked: RedisClient
) -> None:
    """A write to a key of a slot being migrated, that its old master no longer holds, is
    answered ASK: only a lone command can be sent on to the new master (ASKING first), not a
    pipeline with its WAIT. After a few tries it fails as the outage it is (503, back off),
    where it was sent again for ever."""
    key = "cv:test:{migrating-flush}"
    assert await acked.get(key) is None  # the slots read
    slot, source = key_slot(key.encode()), cluster.master_of(key)
    target = next(node for node in cluster.masters if node.port != source.port)
    moves = ((target, "IMPORTING", source.node_id), (source, "MIGRATING", target.node_id))
    for node, state, peer in moves:
        with node.client() as admin:
            admin.execute_command("CLUSTER SETSLOT", slot, state, peer)
    try:
        with pytest.raises(TryAgainError):
            await asyncio.wait_for(acked.set(key, 1), 10)
    finally:
        for node, *_ in moves:
            with node.client() as admin:
                admin.execute_command("CLUSTER SETSLOT", slot, "STABLE")


async def test_a_write_pipeline_waits_on_the_master_a_slot_moved_to(
    cluster: LocalCluster, cluster_client: RedisClient, one_ack: str
) -> None:
    """`run_pipeline` (here a Batch API create) queues its WAIT on the master the client
    believes owns the slot. When the slot has moved, that master answers MOVED to the write,
    redis-py sent the write again alone to the new one, and the WAIT ran where nothing was
    written: a 202 no replica confirmed. The pipeline now runs again, whole, on the new
    master. (`cluster_client` loaded the scripts, as the processes do at start.)"""
    client = connect(one_ack, name="resharded-pipeline", blocks_ms=0)
    store = JobStore(client, KEYS, 60)
    job = _new_job("resharded", "default")
    try:
        assert await store.get(job.entry.job_id) is None  # the slots read
        target = _reshard(cluster, job.stream)
        assert await store.create_many([job]) == []
    finally:
        await client.aclose()
    with target.client() as owner:
        assert owner.exists(KEYS.job(job.entry.job_id))
    assert _waits(cluster)[target.port] == 1


async def test_a_producer_and_the_broker_start_on_seed_nodes_while_the_urls_node_is_down(
    cluster: LocalCluster, settings_env: Callable[..., None]
) -> None:
    """`CONVEYOR_REDIS_URL` names one node: down when they started, the producer (its topology
    read), the webhook broker and a webhook task's client could not come up, though the cluster
    served. The nodes `CONVEYOR_REDIS_CLUSTER_NODES` names are tried too."""
    seeds = ",".join(f"127.0.0.1:{node.port}" for node in cluster.masters)
    settings_env(CONVEYOR_REDIS_CLUSTER="1", CONVEYOR_REDIS_CLUSTER_NODES=seeds)
    down = f"redis://127.0.0.1:{free_port()}/0"
    app = create_app(get_settings().model_copy(update={"redis_url": down, "auth": "disabled"}))
    async with app_client(app) as http:
        accepted = await http.post("/v1/jobs", json={"model": "identity", "inputs": {"n": 1}})
        assert accepted.status_code == 202, accepted.text
        assert (await http.get(f"/v1/jobs/{accepted.json()['id']}")).json()["status"] == "queued"
    owner = cluster.master_of(BROKER_TAG).port
    assert broker_app(down).conf.broker_url.startswith(f"conveyor-redis://127.0.0.1:{owner}/")
    settings_env(CONVEYOR_REDIS_URL=down)  # and a webhook task's client, recording attempts
    webhook_delivery._redis.cache_clear()
    try:
        assert webhook_delivery._redis().ping()
    finally:
        webhook_delivery._redis.cache_clear()

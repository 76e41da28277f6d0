"""What a queue-ETA refresh costs Redis: every lane's drained counters and undelivered entries
in one round trip (they were two pipelines, one per kind of read), then the worker registry's
two. On a cluster, lanes of partitions on several masters are still read right, each partition's
two lanes in one EVAL."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterable

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, ConnectionPool

from conveyor.valkey_cluster import LocalCluster
from shared.drain_rate import drain_rates_and_waiting
from shared.job_store import stamp_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.queue_eta import QueueEta, StartBy
from shared.queue_position import RATE_WINDOW_S, QueuePositions
from shared.redis_client import RedisClient
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
STEADY = KEYS.queue("steady", "default")
# A command's name as RESP frames it: `*<args>\r\n$<length>\r\n<NAME>\r\n`.
COMMAND = re.compile(rb"\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n")

Writes = list[list[str]]


@pytest.fixture
async def recorded(redis_url: str) -> AsyncIterator[tuple[aioredis.Redis, Writes]]:
    """A client on the real server whose connections note the commands of each write they
    send: one round trip each (a pipeline is one write)."""
    writes: Writes = []

    class Recording(Connection):
        async def send_packed_command(
            self, command: bytes | str | Iterable[bytes], check_health: bool = True
        ) -> None:
            if isinstance(command, str):
                command = command.encode()
            packed = command if isinstance(command, bytes) else b"".join(command)
            writes.append([name.decode().upper() for name in COMMAND.findall(packed)])
            await super().send_packed_command(packed, check_health)

    client = aioredis.Redis(
        connection_pool=ConnectionPool.from_url(redis_url, connection_class=Recording)
    )
    await client.flushdb()
    yield client, writes
    await client.aclose()


async def test_a_refresh_reads_the_lanes_in_one_round_trip(
    recorded: tuple[aioredis.Redis, Writes],
) -> None:
    client, writes = recorded
    eta = QueueEta(client, QueuePositions(client, KEYS), ModelRepository.load(FIXTURES))
    config = eta.repository.models["steady"]
    await client.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    await client.xadd(STEADY, {"n": 1})  # work waits: the drain rate is the worker's capacity
    await client.set(KEYS.drained(STEADY, int(time.time()) - 1), 9)
    beat = Heartbeat("w-1", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(client, KEYS).publish(beat)
    await eta.refresh()  # opens the connections a refresh uses (their handshakes are writes)
    writes.clear()

    await eta.refresh()

    lanes = [write for write in writes if {"MGET", "EVAL"} & set(write)]
    partitions = sum(len(c.variants) for c in eta.repository)
    assert len(lanes) == 1, writes
    assert sorted(lanes[0]) == ["EVAL"] * partitions + ["MGET"] * 2 * partitions, writes
    assert [write for write in writes if write not in lanes] == [["ZRANGEBYSCORE"], ["HGETALL"]]
    load = eta.load("steady", "default")
    assert load is not None and load.serving == 1
    assert 9 / (RATE_WINDOW_S + 1) <= load.online_per_s <= 9 / RATE_WINDOW_S
    # the entry waiting was read: the capacity is measured, so a job without a deadline is held
    # to max_queue_time_s
    assert eta.max_ahead(config, "default", False, StartBy.of(config, stamp_ms(), 0)) > 0


@pytest.mark.slow
async def test_lanes_on_several_masters_in_one_go(
    cluster: LocalCluster, cluster_client: RedisClient
) -> None:
    """Each partition's rates and jobs waiting, a partition's two lanes in one EVAL on its own
    master: delivered entries are not counted, held ones are (a fair lane's `held`), and a lane
    without a group has all its entries undelivered; the delivered ones are in flight."""
    partitions = [("identity", "default"), ("identity", "canary")]
    lanes = [(KEYS.queue(*p), KEYS.bulk_queue(*p)) for p in partitions]
    (first, first_bulk), (other, other_bulk) = lanes
    assert cluster.master_of(first).port != cluster.master_of(other).port
    second = int(time.time())
    await cluster_client.xgroup_create(first, GROUP, id="0", mkstream=True)
    for index in range(5):
        await cluster_client.xadd(first, {"n": index})
    await cluster_client.xreadgroup(GROUP, "w-1", {first: ">"}, count=2)  # delivered, pending
    await cluster_client.xadd(first_bulk, {"n": 0})  # no group yet: all of it undelivered
    await cluster_client.xadd(other_bulk, {"n": 0})
    await cluster_client.hset(KEYS.fair(other_bulk), "held", 4)
    await cluster_client.set(KEYS.drained(first, second - 2), 10)
    await cluster_client.set(KEYS.drained(other, second - 1), 20)

    backlogs = await drain_rates_and_waiting(cluster_client, KEYS, lanes, 5)

    assert [b.waiting for b in backlogs] == [[3, 1], [0, 5]]
    assert [b.in_flight for b in backlogs] == [2, 0]
    rates = [b.rates for b in backlogs]
    assert 10 / 6 <= rates[0][0] <= 10 / 5
    assert rates[1][0] == pytest.approx(rates[0][0] * 2)
    assert [rates[0][1], rates[1][1]] == [0.0, 0.0]

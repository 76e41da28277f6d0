"""Two more scripts whose reply was lost after the server ran them (a connection torn at the
worst time, through a real proxy to a real Valkey), so that the client sent them again:
- a drain's hand-back lowered the delivery count of the entries it gave back twice: a job
  already redelivered could run once more than `max_deliveries` allows;
- a webhook attempt was appended twice to its job's or batch's `webhook_attempts` (what
  `GET /v1/batches/{id}` shows), by the worker's blocking client on a cluster (on one
  server too since it resends: tests/test_webhooks_r38_retry.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast
from urllib.parse import urlparse

import pytest
import redis
import redis.asyncio as aioredis

from conveyor.valkey_cluster import LocalCluster, local_cluster
from shared.consumer_groups import HAND_BACK
from shared.job_store import JobStore
from shared.keys import GROUP, Keys
from shared.redis_client import blocking_cluster
from tests.lane_rig import abandoned_after, queue_jobs
from tests.reply_dropper import ReplyDropper, served_in_thread
from tests.test_resends_r37_reruns import reply_lost
from workers import webhook_delivery
from workers.partition.stream_reader import StreamReader
from workers.webhook_delivery import AttemptLog

KEYS = Keys("r37-handback:")
PARTITION = abandoned_after(KEYS, 60)
WORKER = "box-37-m"
ATTEMPTS = "r37-handback:job:attempts"


async def _delivery_count(aredis: aioredis.Redis, stream: str) -> int:
    [row] = await aredis.xpending_range(stream, GROUP, "-", "+", 1)
    return int(row["times_delivered"])


async def test_a_hand_back_sent_again_uncounts_the_given_up_delivery_once(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    stream = PARTITION.online
    await aredis.delete(stream)
    await StreamReader(aredis, KEYS, PARTITION.streams, WORKER).ensure_groups()
    await queue_jobs(JobStore(aredis, KEYS, ttl_s=60), stream, "given-up")
    read: Any = await aredis.xreadgroup(GROUP, WORKER, {stream: ">"})
    [(_, [(entry_id, _)])] = read
    await aredis.xclaim(stream, GROUP, WORKER, 0, [entry_id])  # a redelivery: its second run
    assert await _delivery_count(aredis, stream) == 2

    async with reply_lost(redis_url, aredis, HAND_BACK) as client:
        reader = StreamReader(client, KEYS, PARTITION.streams, WORKER)
        assert await reader.hand_back(stream, [entry_id], 60_000) == 1  # the first run's answer

    assert await _delivery_count(aredis, stream) == 1  # the given-up run alone uncounted


@pytest.fixture(scope="module")
def one_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of one master: the cheapest Redis on which the worker's client resends."""
    with local_cluster(tmp_path_factory.mktemp("cluster"), masters=1, replicas=0) as formed:
        yield formed


@contextmanager
def cluster_reply_lost(cluster: LocalCluster, script: str) -> Iterator[redis.RedisCluster]:
    """The webhook worker's client on a cluster (`blocking_cluster`), reaching its node
    through a proxy, run in a thread, that loses the reply to its first call of `script`."""
    port = cluster.masters[0].port
    with cluster.client() as direct:
        direct.script_load(script)  # the reply lost is the run's, not a NOSCRIPT
    marker = hashlib.sha1(script.encode()).hexdigest().encode()
    proxy = ReplyDropper("127.0.0.1", port, marker)
    with served_in_thread(proxy) as url:
        to_proxy = ("127.0.0.1", urlparse(url).port)
        client = blocking_cluster(url, [], address_remap=lambda node: to_proxy)
        try:
            yield client
            assert proxy.dropped == 1
        finally:
            client.close()


def _attempts(client: redis.Redis | redis.RedisCluster) -> list[dict[str, Any]]:
    return list(json.loads(client.hget(ATTEMPTS, "webhook_attempts") or b"[]"))


def test_a_webhook_attempt_sent_again_is_recorded_once(one_node_cluster: LocalCluster) -> None:
    first = {"attempt": 1, "at": 1.25, "status_code": 500, "error": "HTTP 500"}
    second = {"attempt": 2, "at": 3.5, "status_code": 200, "error": None}
    with one_node_cluster.client() as direct:
        direct.delete(ATTEMPTS)
        direct.hset(ATTEMPTS, "status", "succeeded")
        AttemptLog(direct).record(ATTEMPTS, first, "retrying")

        with cluster_reply_lost(one_node_cluster, webhook_delivery._APPEND_ATTEMPT) as client:
            assert AttemptLog(cast(redis.Redis, client)).record(ATTEMPTS, second, "delivered")

        assert _attempts(direct) == [first, second]
        assert direct.hget(ATTEMPTS, "webhook_status") == b"delivered"


def test_attempts_that_differ_or_quote_another_are_each_recorded(
    redis_client: redis.Redis,
) -> None:
    """The rerun check matches a whole attempt: not one with the same number at another time,
    nor one written out inside another's error text."""
    redis_client.delete(ATTEMPTS)
    redis_client.hset(ATTEMPTS, "status", "succeeded")
    quoted = {"attempt": 2, "at": 1.5}
    attempts: list[dict[str, Any]] = [
        {"attempt": 1, "at": 1.5, "error": json.dumps(quoted, separators=(",", ":"))},
        {"attempt": 1, "at": 105},  # `1.5` as a Lua pattern matches `105`
        {"attempt": 1, "at": 1.55},
        {"attempt": 1, "at": 1.5},
        quoted,
    ]
    log = AttemptLog(redis_client)
    for attempt in attempts:
        assert log.record(ATTEMPTS, attempt, "retrying")
    assert _attempts(redis_client) == attempts

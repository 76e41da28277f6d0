"""The producer's token hub on a real Valkey Cluster (#12): one blocking XREAD spans one slot, so
the hub reads each partition's token streams with a reader of its own; streams of partitions on
different masters are followed at once, and each listener gets only its stream's entries."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from conveyor.valkey_cluster import LocalCluster
from producer_api.token_hub import StreamUnreadable, TokenHub
from shared.keys import Keys, job_tag, new_job_id
from shared.redis_client import RedisClient
from shared.settings import get_settings

pytestmark = pytest.mark.slow
KEYS = Keys()
PARTITIONS = (("identity", "default"), ("identity", "canary"))


@pytest.fixture
def cluster_settings(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This process's settings name the cluster (the hub's readers are made by `connect`)."""
    url = f"redis://127.0.0.1:{cluster.masters[0].port}/0"
    monkeypatch.setenv("CONVEYOR_REDIS_CLUSTER", "1")
    monkeypatch.setenv("CONVEYOR_REDIS_URL", url)
    get_settings.cache_clear()
    yield url
    get_settings.cache_clear()


async def _next_rows(queue: asyncio.Queue[Any]) -> list[Any]:
    delivery = await asyncio.wait_for(queue.get(), 10)
    assert not isinstance(delivery, StreamUnreadable)
    rows: list[Any] = delivery
    return rows


async def test_streams_of_partitions_on_different_masters_are_followed_at_once(
    cluster: LocalCluster, cluster_client: RedisClient, cluster_settings: str
) -> None:
    jobs = [new_job_id(model, variant) for model, variant in PARTITIONS]
    streams = [KEYS.tokens(job_id) for job_id in jobs]
    assert len({cluster.master_of(stream).port for stream in streams}) == 2
    hub = TokenHub(cluster_settings, cluster_client, KEYS, "hub-test")
    try:
        async with (
            hub.listen(job_tag(jobs[0]), streams[0], "0-0") as first,
            hub.listen(job_tag(jobs[1]), streams[1], "0-0") as second,
        ):
            for n, stream in enumerate(streams):
                await cluster_client.xadd(stream, {"kind": "token", "text": f"t{n}", "tokens": 1})
            got = [await _next_rows(first), await _next_rows(second)]
        assert [rows[0][1][b"text"] for rows in got] == [b"t0", b"t1"]
        for job_id, stream in zip(jobs, streams, strict=True):  # each wake stream in its slot
            wake = KEYS.token_hub_wake("hub-test", job_tag(job_id))
            assert key_slot(wake.encode()) == key_slot(stream.encode())
    finally:
        await hub.stop()

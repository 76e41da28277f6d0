"""Group commit on a real Valkey Cluster with `CONVEYOR_REPLICA_ACKS` (#12): a flush waits for
the replicas of the masters it wrote to, and only theirs. A flush of reads waits for none, so
one shard that lost its replicas never holds up (or fails) another shard's writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from conveyor.valkey_cluster import LocalCluster
from producer_api.jobs.group_commit import group_committing
from shared.redis_client import RedisClient
from shared.settings import get_settings

pytestmark = pytest.mark.slow


@pytest.fixture
async def acked(
    cluster: LocalCluster, cluster_client: RedisClient, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[RedisClient]:
    """A group-committing cluster client whose writes wait for one replica."""
    url = f"redis://127.0.0.1:{cluster.masters[0].port}/0"
    for name, value in {"CONVEYOR_REDIS_CLUSTER": "1", "CONVEYOR_REPLICA_ACKS": "1"}.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    client = group_committing(cluster_client, url, "group-commit-test")
    yield client
    await client.aclose()
    get_settings.cache_clear()


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

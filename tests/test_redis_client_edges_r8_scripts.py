"""Scripts a cluster node lost, loaded again while another node is down: a replica that died is
still listed until the cluster marks it failed (`cluster-node-timeout`), and loading the scripts
on every node failed on it, so every call that met NOSCRIPT meanwhile failed (a 503), on masters
that had answered."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest

from conveyor.valkey_cluster import LocalCluster
from shared.redis_client import RedisClient, call_script, connect, preload, run_script

pytestmark = pytest.mark.slow
COUNTED = "return redis.call('INCR', KEYS[1])"
KEYS = ["{a}count", "{b}count", "{c}count"]


@pytest.fixture
async def clustered(
    cluster: LocalCluster, settings_env: Callable[..., None]
) -> AsyncIterator[RedisClient]:
    """A cluster client that has read the slots (its live replicas among them)."""
    settings_env(CONVEYOR_REDIS_CLUSTER="1")
    client = connect(f"redis://127.0.0.1:{cluster.masters[0].port}/0", blocks_ms=0)
    await cast(Any, client).initialize()
    yield client
    await client.aclose()


async def test_scripts_are_loaded_again_past_a_replica_that_died(
    cluster: LocalCluster, clustered: RedisClient
) -> None:
    counted = clustered.register_script(COUNTED)
    cluster.kill(cluster.replicas[0])  # no failover: listed till it is marked failed
    await preload(clustered, [COUNTED])  # a process that starts meanwhile
    for master in cluster.masters:
        assert master.client().script_exists(counted.sha) == [True]
        master.client().script_flush()  # restarted since
    assert await call_script(counted, [KEYS[0]], []) == 1
    for master in cluster.masters:
        master.client().script_flush()
    assert await run_script(clustered, counted, [([key], []) for key in KEYS]) == [2, 1, 1]

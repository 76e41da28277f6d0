"""The local Valkey Cluster the clustering tests stand on (#12): formed from the embedded
binary, every slot served, replicas synced, and a kill -9'd master replaced by its replica."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conveyor.valkey_cluster import SLOTS, local_cluster

pytestmark = pytest.mark.slow


def test_three_masters_three_replicas_and_failover(tmp_path: Path) -> None:
    with local_cluster(tmp_path, masters=3, node_timeout_ms=1000) as cluster:
        client = cluster.client()
        keys = [f"probe:{i}" for i in range(64)]
        for key in keys:
            client.set(key, key)
        owners = {cluster.master_of(key).port for key in keys}
        assert owners == {m.port for m in cluster.masters}  # 64 keys land on all three
        roles = [node.client().info("replication")["role"] for node in cluster.replicas]
        assert roles == ["slave"] * 3
        slots = sum(
            int(end) - int(start) + 1
            for start, end, *_ in client.execute_command("CLUSTER SLOTS", target_nodes="random")
        )
        assert slots == SLOTS

        victim = cluster.master_of("probe:0")
        moved = [k for k in keys if cluster.master_of(k) is victim]
        started = time.monotonic()
        cluster.kill(victim)
        cluster.wait_healthy(timeout_s=30)
        promoted_after_s = time.monotonic() - started
        heir = cluster.master_of("probe:0")
        assert heir is not victim and heir in cluster.replicas
        print(f"replica promoted {promoted_after_s:.1f} s after kill -9 (node timeout 1 s)")
        survivor = cluster.client()
        assert [survivor.get(k) for k in moved] == [k.encode() for k in moved]

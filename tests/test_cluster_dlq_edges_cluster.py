"""The local Valkey Cluster's own tooling (conveyor/valkey_cluster.py): what the clustering tests
stand on must keep working once a test has killed a master."""

from __future__ import annotations

from redis.crc import key_slot

from conveyor.valkey_cluster import LocalCluster


def test_a_client_starts_from_a_live_node_after_the_first_master_is_killed(
    cluster: LocalCluster,
) -> None:
    """`client()` started from the first master only: once a failover test had killed it, every
    later client of the cluster failed to come up ("Redis Cluster cannot be connected"), though
    the other masters still served their slots. The kill stays: the module's cluster is done."""
    cluster.kill(cluster.masters[0])
    # a slot past the first master's range (0-5460 of three), served by a live master
    key = next(key for key in (f"probe:{i}" for i in range(100)) if key_slot(key.encode()) > 6000)
    with cluster.client() as client:
        client.set(key, "alive")
        assert client.get(key) == b"alive"

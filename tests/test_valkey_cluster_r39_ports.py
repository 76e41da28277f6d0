"""A local cluster's node whose port another process binds between its choice and the server's
bind (an outgoing connection takes ports from the same range) is started again on other ports:
the node died at start ("bind: Address already in use"), and a fresh run's cluster tests with
it. On real Valkey servers; the first port handed out is one this test holds."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import valkey_cluster
from conveyor.stack import free_port


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def test_a_node_whose_bus_port_is_taken_starts_on_another(
    tmp_path: Path, held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([held_port])  # the first node's bus port: taken
    monkeypatch.setattr(valkey_cluster, "free_port", lambda: next(ports, None) or free_port())
    with valkey_cluster.local_cluster(tmp_path, masters=1, replicas=0) as cluster:
        (node,) = cluster.masters
        assert node.bus_port != held_port
        assert node.client().ping()

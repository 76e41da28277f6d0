"""`LocalCluster.master_of` mid-failover, while no live node serves the slot: it raised
StopIteration (the killed master still held it); now it waits for a live master, and says which
it lacks once its timeout is over."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from redis.crc import key_slot

from conveyor.valkey_cluster import LocalCluster, _form, _start_node
from tests.conftest import until

# Two keys of two slots held by the second of two masters (`_slot_ranges`).
KEY, OTHER = [f"k{n}" for n in range(100) if key_slot(f"k{n}".encode()) >= 8192][:2]


@contextmanager
def two_masters(root: Path) -> Iterator[LocalCluster]:
    """Two masters, each knowing the other's slots; not waited healthy (a new master waits 2 s
    before it serves writes, which no test here makes)."""
    cluster = LocalCluster([], [], node_timeout_ms=2000)
    try:
        cluster.masters += [_start_node(root / f"node{n}", 2000) for n in range(2)]
        _form(cluster.masters, [])
        for node in cluster.masters:
            until(
                lambda node=node: len(node.client().execute_command("CLUSTER SLOTS")) == 2,
                every=0.02,
            )
        yield cluster
    finally:
        cluster.stop()


def test_master_of_waits_for_a_live_master_and_says_why_there_is_none(tmp_path: Path) -> None:
    with two_masters(tmp_path) as cluster:
        kept, victim = cluster.masters
        slot = key_slot(KEY.encode())
        assert cluster.master_of(KEY) is victim
        cluster.kill(victim)

        # The kept master takes the slot over while master_of waits, as a promoted replica does.
        take_over = ("CLUSTER", "SETSLOT", slot, "NODE", kept.node_id)
        taker = threading.Timer(0.2, lambda: kept.client().execute_command(*take_over))
        taker.start()
        try:
            assert cluster.master_of(KEY) is kept
        finally:
            taker.join()

        other = key_slot(OTHER.encode())
        with pytest.raises(LookupError, match=f"slot {other} after 0.2s: its master .* is down"):
            cluster.master_of(OTHER, timeout_s=0.2)
        kept.client().execute_command("CLUSTER", "DELSLOTS", slot)
        with pytest.raises(LookupError, match=f"slot {slot} after 0.2s: no node holds it"):
            cluster.master_of(KEY, timeout_s=0.2)

"""`free_port` under pytest-xdist: each worker picks from its own band, below the kernel's
ephemeral range, skipping ports that something listens on. Two workers' picks once met: a
port one had picked for a child still starting was picked again by the other."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from conveyor.stack import EPHEMERAL_PORTS, LOWEST_PICKED_PORT, free_port
from tests.conftest import REPO_ROOT

PICKS = 300


def _picks(worker: str, workers: int) -> list[int]:
    """What a fresh process of xdist worker `worker` of `workers` picks, PICKS times."""
    env = {**os.environ, "PYTEST_XDIST_WORKER": worker, "PYTEST_XDIST_WORKER_COUNT": str(workers)}
    code = (
        "import json; from conveyor.stack import free_port;"
        f" print(json.dumps([free_port() for _ in range({PICKS})]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, check=True
    )
    picks: list[int] = json.loads(out.stdout)
    return picks


def test_two_workers_pick_from_bands_of_their_own_below_the_ephemeral_range() -> None:
    low = int(EPHEMERAL_PORTS.read_text().split()[0])
    first, second = _picks("gw0", 2), _picks("gw1", 2)
    assert len(set(first)) == len(set(second)) == PICKS  # none picked twice by one process
    middle = LOWEST_PICKED_PORT + (low - LOWEST_PICKED_PORT) // 2
    assert all(LOWEST_PICKED_PORT <= port < middle for port in first), first
    assert all(middle <= port < low for port in second), second


def test_a_port_something_listens_on_is_skipped() -> None:
    picked = free_port()
    with socket.socket() as taken:
        # the port after it, the next one this process would pick (or, at the band's end, one
        # it will not pick next: the assertion holds either way)
        taken.bind(("127.0.0.1", picked + 1))
        taken.listen()
        following = free_port()
        assert following not in (picked, picked + 1)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", following))  # free indeed


def test_threads_picking_at_once_get_ports_of_their_own() -> None:
    """`conveyor up` and the tests may start children from several threads: each pick is a
    port of its own (a generator stepped by two threads at once raises)."""
    with ThreadPoolExecutor(8) as pool:
        picks = list(pool.map(lambda _: free_port(), range(PICKS)))
    assert len(set(picks)) == PICKS

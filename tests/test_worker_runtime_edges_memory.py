"""CONVEYOR_WORKER_MAX_MEMORY_MB summed the RSS of a worker and its engines' processes: vLLM
forks its engine core on a CPU, and every page the two still share (the worker's heap, torch's
libraries) counted twice, so a worker was recycled well below the ceiling, or from its start
again and again. Each page now counts once, shared ones split among their holders (PSS), as the
container's memory limit counts them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from workers.runtime.memory_ceiling import resident_mib

HELD_MIB = 200
# A worker holding HELD_MIB MiB, every page touched, that forks an engine sharing them all;
# a line once both run.
FORKING = f"""
import os, time
held = b'\\x01' * ({HELD_MIB} << 20)
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
print(flush=True)
time.sleep(60)
"""


def test_pages_a_forked_engine_shares_with_its_worker_count_once() -> None:
    worker = subprocess.Popen(
        [sys.executable, "-c", FORKING], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert worker.stdout is not None
        worker.stdout.readline()
        # two interpreters' own pages besides (a few MiB each): well under twice the heap
        ceiling_mib = HELD_MIB * 1.4
        assert HELD_MIB * 0.9 < resident_mib(worker.pid) < ceiling_mib
        # as MemoryCeiling measures: summed RSS (twice the heap) passes it, PSS does not
        assert resident_mib(worker.pid, above_mib=ceiling_mib) < ceiling_mib
    finally:
        os.killpg(worker.pid, signal.SIGKILL)  # the forked engine too
        worker.wait()

"""CONVEYOR_WORKER_MAX_MEMORY_MB counts what a worker's engines hold in processes of their own:
vLLM's engine core (a child) and its executor's worker (a grandchild) hold most of an LLM
worker's memory. (The recycle itself, on a real worker: tests/test_faults.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from workers.runtime.memory_ceiling import resident_mib

HELD_MIB = 200
# A child whose own child holds HELD_MIB MiB, every page touched; a line once it does.
NESTED = f"""
import subprocess, sys
holder = "held = b'\\\\x01' * ({HELD_MIB} << 20); print(flush=True); import time; time.sleep(60)"
subprocess.run([sys.executable, "-c", holder])
"""


def test_a_workers_descendants_count_toward_its_memory() -> None:
    before = resident_mib(os.getpid())
    child = subprocess.Popen(
        [sys.executable, "-c", NESTED], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert child.stdout is not None
        child.stdout.readline()  # the grandchild holds its memory now
        assert resident_mib(os.getpid()) - before > HELD_MIB * 0.9
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the grandchild too
        child.wait()

"""CONVEYOR_WORKER_MAX_MEMORY_MB: a worker whose resident memory passes it is recycled, as Celery
recycles a pool process past `worker_max_memory_per_child`: it finishes the work in hand and
writes it back, stops reading, closes its engines and exits with `RECYCLED`, for its supervisor
(`conveyor up`, `conveyor autoscale`, Kubernetes) to start a fresh one. A slow leak (a library's
cache, a fragmented heap) otherwise ends in the OOM killer's SIGKILL, mid-batch: the batch's
jobs wait out their visibility timeout, each kill counted as one of their deliveries."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from workers.runtime.process_tree import descendants

log = logging.getLogger(__name__)

# A planned exit, told apart from a crash's EX_SOFTWARE (70) in the supervisor's log.
RECYCLED = os.EX_TEMPFAIL  # 75
CHECK_EVERY_S = 1.0
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def resident_mib(pid: int, above_mib: float = 0.0) -> float:
    """The resident memory of process `pid` and its descendants, in MiB: an LLM worker's vLLM
    engine core holds most of its memory. Each page counts once, as the container's memory
    limit counts it: one they share (a forked engine core's copy-on-write pages, a library) is
    split among its holders (PSS), where summed RSS counted it in each and recycled a worker
    well below its ceiling. PSS costs the kernel a walk of every page table (~20 ms a GiB), so
    it is read only once summed RSS, read from /proc/*/statm for next to nothing and never
    less, passes `above_mib`. A process that ended meanwhile counts nothing."""
    family = [pid, *descendants(pid)]
    rss_mib = sum(map(_rss_kib, family)) / 1024
    return rss_mib if rss_mib <= above_mib else sum(map(_pss_kib, family)) / 1024


def _pss_kib(pid: int) -> int:
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:  # none (a kernel before 4.14), withheld (not dumpable), or the process gone
        return _rss_kib(pid)
    return next(
        (int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0
    )


def _rss_kib(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE_BYTES // 1024
    except (FileNotFoundError, ProcessLookupError):
        return 0


class MemoryCeiling:
    """Runs beside the partition loops (`run_together`), stopped with them: once the worker's
    resident memory passes `max_mib`, it says why and calls `recycle` (which stops them as a
    SIGTERM does, never mid-batch), then returns."""

    def __init__(self, max_mib: int, recycle: Callable[[], None]) -> None:
        self.max_mib = max_mib
        self._recycle = recycle
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        while not self.stopping.is_set():
            # on a thread: past the summed RSS, the PSS read takes ~10-20 ms a GiB, which held
            # up the serving loop (a batch's write-back, a stream's tokens) once a second
            used = await asyncio.to_thread(resident_mib, os.getpid(), self.max_mib)
            if used > self.max_mib:
                log.warning(
                    "resident memory %.0f MiB (its engines' processes included) passed "
                    "CONVEYOR_WORKER_MAX_MEMORY_MB=%d: the worker finishes the work in hand, "
                    "then exits (status %d) to be restarted",
                    used,
                    self.max_mib,
                    RECYCLED,
                )
                self._recycle()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), CHECK_EVERY_S)

"""The memory ceiling's look at the worker's memory leaves the serving loop free."""

from __future__ import annotations

import threading

import pytest

from workers.runtime import memory_ceiling
from workers.runtime.memory_ceiling import MemoryCeiling


async def test_the_memory_ceiling_reads_memory_off_the_serving_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the summed RSS, each look read every process's PSS on the loop that serves the
    partitions (~10-20 ms a GiB): an LLM worker's loop stood still a fifth of each second."""
    readers: list[threading.Thread] = []
    measure = memory_ceiling.resident_mib

    def watched(pid: int, above_mib: float = 0.0) -> float:
        readers.append(threading.current_thread())
        return measure(pid, above_mib)

    monkeypatch.setattr(memory_ceiling, "resident_mib", watched)
    recycled: list[bool] = []
    await MemoryCeiling(1, lambda: recycled.append(True)).run()  # 1 MiB: past it at once
    assert recycled == [True]
    assert readers and threading.current_thread() not in readers

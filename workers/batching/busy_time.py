"""Wall time a partition's micro-batch loop had work in hand, from a micro-batch's read to its
write-back, micro-batches that overlap (a staged engine's) counted once: a replica's cost per
job for backlog seconds is this ÷ the jobs it ran, 1 ÷ its throughput (cost_meter.py). Engine
time alone left the host work out (tokenising, the round trips), which beside a GPU is most of
a job's cost: an encoder's micro-batch of 64 spends ~10 µs of engine time per job against
~0.3 ms of host work, and a pool scaled on backlog seconds read ~30 times too cheap."""

from __future__ import annotations

from shared.metrics import BATCH_BUSY


class BusyTime:
    def __init__(self, model: str, variant: str) -> None:
        self._counter = BATCH_BUSY.labels(model, variant)
        self._until = 0.0  # the end of what is counted (time.monotonic)

    def held(self, read_at: float, written_at: float) -> None:
        """One micro-batch's time in hand, less the part another one's already counted (write-
        backs come in the order of the reads)."""
        start = max(read_at, self._until)
        if written_at > start:
            self._counter.inc(written_at - start)
            self._until = written_at

"""What one replica's work costs, measured from this process's own Prometheus counters at every
heartbeat, for backlog seconds (shared/backlog.py): a `batch` partition's wall seconds with a
micro-batch in hand per job run (workers/batching/busy_time.py), a `generate` partition's busy
seconds (a generation running) per completion token and its tokens per run that generated any
(its time to first token observed). The loops count these anyway, a counter per micro-batch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shared.backlog import ServiceCost
from shared.metrics import BATCH_BUSY, BATCH_SIZE, GENERATE_BUSY, TOKENS, TTFT
from shared.model_repository import ModelConfig

# A measurement's weight grows with the busy time behind it: 30 s of work halves the weight of
# everything measured before, so the cost follows a changed model within a minute of load.
HALF_LIFE_BUSY_S = 30.0


def labelled_total(metric: Any, suffix: str, labels: dict[str, str]) -> float:
    """Sum of one sample series (`_total`, `_sum`) over the label sets that include `labels`."""
    return sum(
        sample.value
        for family in metric.collect()
        for sample in family.samples
        if sample.name.endswith(suffix) and labels.items() <= sample.labels.items()
    )


@dataclass(slots=True)
class _Partition:
    config: ModelConfig
    variant: str
    seen: tuple[float, float, float] = (0.0, 0.0, 0.0)  # busy s, units, jobs run
    counted: float = 0.0  # units when jobs last finished: theirs since, for units per job
    cost: ServiceCost | None = None

    def counters(self) -> tuple[float, float, float]:
        labels = {"model": self.config.name, "variant": self.variant}
        if self.config.kind == "batch":
            busy = labelled_total(BATCH_BUSY, "_total", labels)
            units = labelled_total(BATCH_SIZE, "_sum", labels)
            return busy, units, units
        busy = labelled_total(GENERATE_BUSY, "_total", labels)
        units = labelled_total(TOKENS, "_total", labels)
        # every run that generated, failed and cancelled ones too (their tokens are in
        # `units`); not a job ended before it ran, nor one dead-lettered after a crash elsewhere
        jobs = labelled_total(TTFT, "_count", labels)
        return busy, units, jobs

    def measure(self) -> ServiceCost | None:
        """The smoothed cost after this beat, or None when no unit of work was counted since
        the last one."""
        now = self.counters()
        busy, units, jobs = (a - b for a, b in zip(now, self.seen, strict=True))
        # a generation spans beats: its tokens are those since jobs last finished, not this
        # beat's (a 256-token answer over seven beats counted as the last beat's 30)
        per_job = (now[1] - self.counted) / jobs if jobs > 0 else None
        if jobs > 0:
            self.counted = now[1]
        if units <= 0 or busy <= 0:
            # busy time with no unit to show for it yet (a prompt's prefill across a beat, a
            # batch's write-back counted just before its jobs) waits for the units it bought:
            # dropped, the prefill's seconds were left out of the cost per token
            self.seen = (*self.seen[:2], now[2])
            return None
        self.seen = now
        if self.cost is None:
            self.cost = ServiceCost(busy / units, per_job or 0.0)
            return self.cost
        weight = 1 - math.pow(0.5, busy / HALF_LIFE_BUSY_S)
        old = self.cost
        self.cost = ServiceCost(
            old.seconds_per_unit + weight * (busy / units - old.seconds_per_unit),
            old.units_per_job if per_job is None else _blend(old.units_per_job, per_job, weight),
        )
        return self.cost


def _blend(old: float, new: float, weight: float) -> float:
    return new if old <= 0 else old + weight * (new - old)


class CostMeter:
    """One per worker; `measure()` at every beat returns the partitions that did work."""

    def __init__(self, partitions: list[tuple[ModelConfig, str]]) -> None:
        self._partitions = [_Partition(config, variant) for config, variant in partitions]

    def measure(self) -> dict[tuple[str, str], ServiceCost]:
        costs = {}
        for partition in self._partitions:
            if (cost := partition.measure()) is not None:
                costs[(partition.config.name, partition.variant)] = cost
        return costs

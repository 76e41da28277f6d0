"""`conveyor autoscale`: KEDA's decision for one machine. Each pool (model, variant) is polled
with the triggers, formula and scale-down window KEDA and the HPA use (`scaling_math`; a pool
scaled on seconds of backlog reads them from Redis with the producer's formula), and worker
processes are started or stopped between min and max replicas, none waited for: a starting
worker counts at once and the polls after confirm it got ready (`alive`), a stopped one (SIGTERM,
so it drains) leaves the count at once, as a terminating pod leaves the HPA's. A worker that died
(killed for memory, crashed) leaves the count at the next poll and the formula replaces it, as
Kubernetes restarts a pod."""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from autoscaling.keda import scaled_object
from autoscaling.scaling_math import (
    BacklogTrigger,
    Reading,
    StreamTrigger,
    Trigger,
    desired_replicas,
    poll,
)
from shared.keys import Keys
from shared.model_repository import ModelConfig

log = logging.getLogger(__name__)


@dataclass
class PoolScaler:
    """One pool, as its rendered ScaledObject has KEDA and the HPA decide it: up at once to the
    HPA's count; down, one worker per tick, only to the highest count the HPA asked for over
    its scale-down stabilization window `window_s`; to zero only after `cooldown_s` without
    an active trigger (KEDA's cooldownPeriod, which gates that step alone)."""

    name: str
    triggers: list[Trigger]
    min_replicas: int
    max_replicas: int
    cooldown_s: float
    window_s: float
    start_worker: Callable[[str], str]
    stop_workers: Callable[[list[str]], object]
    alive: Callable[[str], bool]
    workers: list[str] = field(default_factory=list)
    last_active: float = 0.0
    started: int = 0
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)

    @classmethod
    def for_partition(
        cls,
        config: ModelConfig,
        variant: str,
        keys: Keys,
        start_worker: Callable[[str], str],
        stop_workers: Callable[[list[str]], object],
        alive: Callable[[str], bool],
    ) -> PoolScaler:
        """The pool's ScaledObject as rendered for KEDA, read by this autoscaler."""
        spec = scaled_object(config, variant, keys)["spec"]
        scale_down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        return cls(
            f"{config.name}:{variant}",
            [_trigger(t, config, variant, keys) for t in spec["triggers"]],
            spec["minReplicaCount"],
            spec["maxReplicaCount"],
            spec["cooldownPeriod"],
            scale_down["stabilizationWindowSeconds"],
            start_worker,
            stop_workers,
            alive,
        )

    def tick(self, client: redis.Redis, now: float | None = None) -> int:
        """Poll once and act; returns the worker count afterwards."""
        now = time.monotonic() if now is None else now
        self._forget_dead()
        current = len(self.workers)
        wanted = self._wanted(poll(client, self.triggers), current, now)
        if wanted > current:
            self._scale_up(wanted - current)
        elif wanted < current:
            self._scale_down()
        return len(self.workers)

    def _wanted(self, readings: list[Reading], current: int, now: float) -> int:
        """KEDA's zero once the pool has idled for `cooldown_s` (or is there already), else
        the HPA's count, whose minimum is one, stabilized."""
        if any(r.active for r in readings):
            self.last_active = now
        elif self.min_replicas == 0 and (current == 0 or now - self.last_active >= self.cooldown_s):
            return 0
        floor = max(self.min_replicas, 1)
        count = desired_replicas(readings, floor, self.max_replicas, current)
        return self._stabilized(count, current, now)

    def _stabilized(self, count: int, current: int, now: float) -> int:
        """The HPA's scale-down stabilization: never below the highest count recommended within
        the window; scale-up is not held back. (Gated on inactivity instead, the autoscaler
        kept every replica while anything at all was queued.)"""
        while self.recommendations and self.recommendations[0][0] <= now - self.window_s:
            self.recommendations.popleft()
        self.recommendations.append((now, count))
        peak = max(recommended for _, recommended in self.recommendations)
        return max(count, min(current, peak))

    def _forget_dead(self) -> None:
        """Workers that died leave the count: counted on, they kept their pool short for good
        (the formula saw its replicas all there). One whose start failed (`alive` raised, having
        stopped it) leaves it too, and its error ends the tick, as a failed start did."""
        for name in list(self.workers):
            try:
                running = self.alive(name)
            except BaseException:
                self.workers.remove(name)
                raise
            if not running:
                log.warning(
                    "%s: worker %s exited; a new one replaces it if needed", self.name, name
                )
                self.workers.remove(name)

    def _scale_up(self, count: int) -> None:
        log.info("scale up", extra={"pool": self.name, "from": len(self.workers), "by": count})
        for _ in range(count):
            self.started += 1
            # The pool's own name, `:` included: `a-b:c` and `a:b-c` were both `a-b-c`.
            self.workers.append(self.start_worker(f"{self.name}-{self.started}"))

    def _scale_down(self) -> None:
        log.info("scale down", extra={"pool": self.name, "from": len(self.workers)})
        self.stop_workers([self.workers.pop()])


def pool_scalers(
    partitions: Iterable[tuple[ModelConfig, str]],
    keys: Keys,
    start_worker: Callable[[str, str], str],
    stop_workers: Callable[[list[str]], object],
    alive: Callable[[str], bool],
) -> list[PoolScaler]:
    """One scaler per distinct pool, in the order named; `start_worker(pool, name)`.
    Overlapping selectors (`minilm,minilm:torch`) named a pool twice, and its two scalers
    each started workers blind to the other's."""
    pools = {f"{config.name}:{variant}": (config, variant) for config, variant in partitions}
    return [
        PoolScaler.for_partition(
            config, variant, keys, functools.partial(start_worker, pool), stop_workers, alive
        )
        for pool, (config, variant) in pools.items()
    ]


def _trigger(rendered: dict[str, Any], config: ModelConfig, variant: str, keys: Keys) -> Trigger:
    """The rendered trigger as the local autoscaler reads it."""
    if rendered["type"] == "redis-streams":
        return StreamTrigger.from_metadata(rendered["metadata"])
    return BacklogTrigger.from_metadata(rendered["metadata"], config, variant, keys)

"""`conveyor autoscale`: KEDA's decision for one machine. Each pool (model, variant) is polled
with the same triggers and formula KEDA and the HPA use (`scaling_math`; a pool scaled on
seconds of backlog reads them from Redis with the producer's formula), and worker processes
are started or stopped between min and max replicas; stops are SIGTERM, so workers drain. A
worker that died (killed for memory, crashed) leaves the count at the next poll and the formula
replaces it, as Kubernetes restarts a pod."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from autoscaling.keda import pool_triggers
from autoscaling.scaling_math import (
    BacklogTrigger,
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
    """One pool. Up at once to what the formula asks; down one worker per tick, and only after
    `cooldown_s` without any active trigger (KEDA's cooldown, the HPA's slow scale-down)."""

    name: str
    triggers: list[Trigger]
    min_replicas: int
    max_replicas: int
    cooldown_s: float
    start_worker: Callable[[str], str]
    stop_worker: Callable[[str], None]
    alive: Callable[[str], bool]
    workers: list[str] = field(default_factory=list)
    last_active: float = 0.0
    started: int = 0

    @classmethod
    def for_partition(
        cls,
        config: ModelConfig,
        variant: str,
        keys: Keys,
        start_worker: Callable[[str], str],
        stop_worker: Callable[[str], None],
        alive: Callable[[str], bool],
    ) -> PoolScaler:
        hints = config.autoscaling
        triggers = [
            _trigger(t, config, variant, keys) for t in pool_triggers(config, variant, keys)
        ]
        return cls(
            f"{config.name}:{variant}",
            triggers,
            hints.min_replicas,
            hints.max_replicas,
            hints.cooldown_s,
            start_worker,
            stop_worker,
            alive,
        )

    def tick(self, client: redis.Redis, now: float | None = None) -> int:
        """Poll once and act; returns the worker count afterwards."""
        now = time.monotonic() if now is None else now
        self._forget_dead()
        readings = poll(client, self.triggers)
        if any(r.active for r in readings):
            self.last_active = now
        current = len(self.workers)
        desired = desired_replicas(readings, self.min_replicas, self.max_replicas, current)
        if desired > current:
            self._scale_up(desired - current)
        elif desired < current and now - self.last_active >= self.cooldown_s:
            self._scale_down()
        return len(self.workers)

    def stop_all(self) -> None:
        while self.workers:
            self._scale_down()

    def _forget_dead(self) -> None:
        """Workers that died leave the count: counted on, they kept their pool short for good
        (the formula saw its replicas all there)."""
        for name in [w for w in self.workers if not self.alive(w)]:
            log.warning("%s: worker %s exited; a new one replaces it if needed", self.name, name)
            self.workers.remove(name)

    def _scale_up(self, count: int) -> None:
        log.info("scale up", extra={"pool": self.name, "from": len(self.workers), "by": count})
        for _ in range(count):
            self.started += 1
            self.workers.append(self.start_worker(f"{self.name.replace(':', '-')}-{self.started}"))

    def _scale_down(self) -> None:
        log.info("scale down", extra={"pool": self.name, "from": len(self.workers)})
        self.stop_worker(self.workers.pop())


def _trigger(rendered: dict[str, Any], config: ModelConfig, variant: str, keys: Keys) -> Trigger:
    """The rendered trigger as the local autoscaler reads it."""
    if rendered["type"] == "redis-streams":
        return StreamTrigger.from_metadata(rendered["metadata"])
    return BacklogTrigger.from_metadata(rendered["metadata"], config, variant, keys)

"""`conveyor autoscale`: KEDA's decision for one machine. Each pool (model, variant) is polled
with the triggers, formula and scale-down window KEDA and the HPA use (`scaling_math`; a pool
scaled on seconds of backlog reads them from Redis with the producer's formula), and worker
processes are started or stopped between min and max replicas, none waited for: a starting
worker counts at once and the polls after confirm it got ready (`alive`), a stopped one (SIGTERM,
so it drains) leaves the count at once, as a terminating pod leaves the HPA's. A worker that died
(killed for memory, crashed) leaves the count at the next poll and the formula replaces it, as
Kubernetes restarts a pod: after a backoff (`shared.restart_backoff`, `conveyor up`'s policy),
which doubles while the pool's workers keep dying soon after their start (CrashLoopBackOff), and
meanwhile the pool starts none. One autoscaler scales a pool at a time, the holder of its lease in
Redis (as one KEDA operator scales a ScaledObject): two of them on one pool each started up to
its max."""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
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
from shared.leader_lock import BlockingLeaderLock
from shared.model_repository import ModelConfig
from shared.restart_backoff import RestartBackoff

log = logging.getLogger(__name__)

# A pool's lease lasts this many polls, this long at least: a leader that misses a poll or two (a
# slow Redis) keeps its pool; one that stopped loses it within one lease.
LEASE_POLLS = 3
MIN_LEASE_S = 10.0


def lease_ms_for(period_s: float) -> int:
    """The lease of an autoscaler that polls every `period_s`."""
    return round(max(LEASE_POLLS * period_s, MIN_LEASE_S) * 1000)


def _lease_owner() -> str:
    """Each scaler a holder of its own, named for its process (two in one process, two)."""
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}"


@dataclass
class PoolScaler:
    """One pool, as its rendered ScaledObject has KEDA and the HPA decide it: up at once to the
    HPA's count; down, one worker per tick, only to the highest count the HPA asked for over
    its scale-down stabilization window `window_s`; to zero only after `cooldown_s` without
    an active trigger (KEDA's cooldownPeriod, which gates that step alone). All only while it
    holds the pool's lease (`lease_key`), renewed every tick and before each start or stop:
    without it, another autoscaler scales the pool, and this one starts nothing and stops every
    worker it had (they drain, and leave the count at once, as on a scale-down); it takes over
    once that one stops renewing."""

    name: str
    triggers: list[Trigger]
    min_replicas: int
    max_replicas: int
    cooldown_s: float
    window_s: float
    start_worker: Callable[[str], str]
    stop_workers: Callable[[list[str]], object]
    alive: Callable[[str], bool]
    lease_key: str
    lease_ms: int
    owner: str = field(default_factory=_lease_owner)
    leading: bool = False  # held the lease at the last tick
    workers: dict[str, float] = field(default_factory=dict)  # each with the tick that started it
    last_active: float = -math.inf  # never: an autoscaler that saw no work has no cooldown
    started: int = 0
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    start_after: float = 0.0  # no worker starts before: the backoff of the last that died
    held: str = ""  # why the last tick started fewer workers than the formula asked for
    # The count the pool is scaled to (its Deployment's replicas), which the HPA's formula
    # starts from: a worker that died is restarted, not subtracted.
    replicas: int = 0

    @classmethod
    def for_partition(
        cls,
        config: ModelConfig,
        variant: str,
        keys: Keys,
        start_worker: Callable[[str], str],
        stop_workers: Callable[[list[str]], object],
        alive: Callable[[str], bool],
        lease_ms: int = lease_ms_for(0.0),
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
            keys.autoscale_leader(config.name, variant),
            lease_ms,
        )

    def tick(self, client: redis.Redis, now: float | None = None) -> int:
        """Poll once and act; returns the count of this autoscaler's workers afterwards. A
        Redis error leaves everything as it was, the lease too: neither of two autoscalers
        takes it over from the other while Redis is out of reach."""
        now = time.monotonic() if now is None else now
        if not self._lead(client, now):  # first: a failed start ends the tick (`_forget_dead`)
            return 0
        self.held = ""
        self._forget_dead(now)
        # From the count scaled to, not the workers left: with one dead, the HPA's 10 %
        # tolerance could keep the smaller count, and the pool stayed one short for good.
        wanted = self._wanted(poll(client, self.triggers), self.replicas, now)
        running = len(self.workers)
        self.replicas = max(wanted, running - 1)  # scale-downs go one worker at a time
        if wanted > running:
            self._scale_up(client, wanted - running, now)
        elif wanted < running and self._lead(client, now):
            self._scale_down(now)
        return len(self.workers)

    def _lead(self, client: redis.Redis, now: float) -> bool:
        """Take or renew the pool's lease, stepping aside without it; asked again before each
        start or stop: a tick that outlasted the lease (a frozen Redis, a slow spawn) scaled
        the pool beside the autoscaler that took it over meanwhile, up to twice its max."""
        self.leading = self._lease(client).hold()
        if not self.leading:
            self._step_aside(now)
        return self.leading

    def _wanted(self, readings: list[Reading], current: int, now: float) -> int:
        """KEDA's zero once the pool has idled for `cooldown_s`, else the HPA's count, whose
        minimum is one, stabilized. A pool whose workers all died meanwhile is not at zero: its
        ScaledObject still asks for them (gated on the count, it went to zero at once)."""
        if any(r.active for r in readings):
            self.last_active = now
        elif self.min_replicas == 0 and now - self.last_active >= self.cooldown_s:
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

    def _forget_dead(self, now: float) -> None:
        """Workers that died leave the count: counted on, they kept their pool short for good
        (the formula saw its replicas all there). One whose start failed (`alive` raised, having
        stopped it) leaves it too, and its error ends the tick, as a failed start did."""
        for name in list(self.workers):
            try:
                running = self.alive(name)
            except BaseException:
                self._gone(name, now)
                raise
            if not running:
                self._gone(name, now)

    def _gone(self, name: str, now: float) -> None:
        """Count a worker out and hold the pool's next start back by the backoff: one that died
        at every start (a broken model) was replaced every other poll, for good."""
        ran_s = now - self.workers.pop(name)
        delay = self.backoff.exited(ran_s)
        self.start_after = now + delay
        log.warning(
            "%s: worker %s ended after %.1fs; backing off, next start in %.1fs (%s)",
            self.name,
            name,
            ran_s,
            delay,
            self.backoff.why(),
        )

    def release(self, client: redis.Redis) -> None:
        """Give the pool's lease up as this autoscaler stops: another one scales the pool at
        its next poll, not a lease later."""
        if self.leading:
            self._lease(client).release()
            self.leading = False

    def _lease(self, client: redis.Redis) -> BlockingLeaderLock:
        return BlockingLeaderLock(client, self.lease_key, self.owner, self.lease_ms)

    def _step_aside(self, now: float) -> None:
        """Another autoscaler holds the pool: stop this one's workers, all at once (kept, they
        ran beside its own, up to its max; stopped one per tick, they went on taking jobs)."""
        self.replicas = 0
        stopped = [self._stop(name, now) for name in list(self.workers)]
        if stopped:
            log.warning("%s: another autoscaler scales it; stopping %s", self.name, stopped)
            self.stop_workers(stopped)

    def _stop(self, name: str, now: float) -> str:
        """Count a worker out to be stopped: one that ran long enough ends the crash loop, as
        its death would have (else the pool's next death after hours up waited the loop's
        longest)."""
        self.backoff.stopped(now - self.workers.pop(name))
        return name

    def _scale_up(self, client: redis.Redis, count: int, now: float) -> None:
        if now < self.start_after:
            wait_s = self.start_after - now
            self.held = f"backing off {wait_s:.1f}s more: {self.backoff.why()}"
            return
        log.info("scale up", extra={"pool": self.name, "from": len(self.workers), "by": count})
        for _ in range(count):
            if not self._lead(client, now):
                return
            self.started += 1
            try:
                # The pool's own name, `:` included: `a-b:c` and `a:b-c` were both `a-b-c`.
                self.workers[self.start_worker(f"{self.name}-{self.started}")] = now
            except Exception:  # as an exit at once: retried at every poll, it never waited
                self.start_after = now + self.backoff.exited(0.0)
                raise

    def _scale_down(self, now: float) -> None:
        log.info("scale down", extra={"pool": self.name, "from": len(self.workers)})
        self.stop_workers([self._stop(next(reversed(self.workers)), now)])


def pool_scalers(
    partitions: Iterable[tuple[ModelConfig, str]],
    keys: Keys,
    start_worker: Callable[[str, str], str],
    stop_workers: Callable[[list[str]], object],
    alive: Callable[[str], bool],
    lease_ms: int,
) -> list[PoolScaler]:
    """One scaler per distinct pool, in the order named; `start_worker(pool, name)`.
    Overlapping selectors (`minilm,minilm:torch`) named a pool twice, and its two scalers
    each started workers blind to the other's."""
    pools = {f"{config.name}:{variant}": (config, variant) for config, variant in partitions}
    return [
        PoolScaler.for_partition(
            config,
            variant,
            keys,
            functools.partial(start_worker, pool),
            stop_workers,
            alive,
            lease_ms,
        )
        for pool, (config, variant) in pools.items()
    ]


def _trigger(rendered: dict[str, Any], config: ModelConfig, variant: str, keys: Keys) -> Trigger:
    """The rendered trigger as the local autoscaler reads it."""
    if rendered["type"] == "redis-streams":
        return StreamTrigger.from_metadata(rendered["metadata"])
    return BacklogTrigger.from_metadata(rendered["metadata"], config, variant, keys)

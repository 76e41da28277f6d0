"""`conveyor up` keeps its pipeline serving: a child that exits (a worker, the producer, the
embedded Valkey) is started again after an exponential backoff, since the queue design survives
a dead process (its jobs are reclaimed). A child that keeps dying (`CRASH_LOOP_EXITS` runs in a
row that each ended within `STABLE_AFTER_S` of their start) is given up on and reported with its
last log lines, while every other child keeps serving."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from conveyor.stack import Stack

CRASH_LOOP_EXITS = 5
# A run this long ends a crash loop: the backoff and the count toward giving up start over. The
# supervisor cannot tell when a restarted child is ready, so time up stands for it.
STABLE_AFTER_S = 60.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
TAIL_LINES = 20


@dataclass
class Child:
    """One supervised process's current run, its crash loop so far and its pending restart."""

    started_at: float
    failures: int = 0  # runs in a row that ended before STABLE_AFTER_S
    restart_at: float | None = None
    failed: bool = False

    def exited(self, now: float) -> int:
        """Count an exit; returns the runs in a row that ended short of STABLE_AFTER_S: unlike
        a window of recent exits, it keeps growing for a child whose every slow start fails."""
        if now - self.started_at >= STABLE_AFTER_S:
            self.failures = 0
        self.failures += 1
        return self.failures


class Supervisor:
    """Restarts `stack`'s children as they exit; `clock` is monotonic seconds (a test's own
    clock simulates runs of any length)."""

    def __init__(
        self, stack: Stack, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stack = stack
        self.say = say
        self.clock = clock
        self.children: dict[str, Child] = {}

    def check(self) -> None:
        """One look at every child: note exits, restart those whose backoff is over."""
        now = self.clock()
        for name, process in list(self.stack.processes.items()):
            child = self.children.setdefault(name, Child(started_at=now))
            if child.failed:
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at, child.started_at = None, now
                    self.say(f"{name}: restarted (pid {self.stack.respawn(name).pid})")
                continue
            code = process.poll()
            if code is not None:
                self._exited(name, child, code, now)

    @property
    def failed(self) -> list[str]:
        return [name for name, child in self.children.items() if child.failed]

    def _exited(self, name: str, child: Child, code: int, now: float) -> None:
        self.stack.exited(name)
        failures = child.exited(now)
        if failures >= CRASH_LOOP_EXITS:
            child.failed = True
            tail = "\n".join(f"  | {line}" for line in self.stack.log_tail(name, TAIL_LINES))
            self.say(
                f"{name}: failed ({failures} exits in a row, none up {STABLE_AFTER_S:.0f}s; last "
                f"{code}); not restarting it, the rest keeps serving. Its last log lines:\n{tail}"
            )
            return
        delay = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (failures - 1))
        child.restart_at = now + delay
        self.say(f"{name}: exited with {code}; restarting in {delay:.1f}s")

"""`conveyor up` keeps its pipeline serving: a child that exits (a worker, the producer, the
embedded Valkey) is started again after an exponential backoff, since the queue design survives
a dead process (its jobs are reclaimed). A child that keeps dying (`CRASH_LOOP_EXITS` exits
within `CRASH_LOOP_WINDOW_S`) is given up on and reported with its last log lines, while every
other child keeps serving."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from conveyor.stack import Stack

CRASH_LOOP_EXITS = 5
CRASH_LOOP_WINDOW_S = 60.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
TAIL_LINES = 20


@dataclass
class Child:
    """One supervised process's recent exits and its pending restart."""

    exits: deque[float] = field(default_factory=deque)
    restart_at: float | None = None
    failed: bool = False

    def exited(self, now: float) -> int:
        """Count an exit; returns the exits within the crash-loop window."""
        self.exits.append(now)
        while self.exits[0] < now - CRASH_LOOP_WINDOW_S:
            self.exits.popleft()
        return len(self.exits)


class Supervisor:
    def __init__(self, stack: Stack, say: Callable[[str], None]) -> None:
        self.stack = stack
        self.say = say
        self.children: dict[str, Child] = {}

    def check(self) -> None:
        """One look at every child: note exits, restart those whose backoff is over."""
        now = time.monotonic()
        for name, process in list(self.stack.processes.items()):
            child = self.children.setdefault(name, Child())
            if child.failed:
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at = None
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
        recent = child.exited(now)
        if recent >= CRASH_LOOP_EXITS:
            child.failed = True
            tail = "\n".join(f"  | {line}" for line in self.stack.log_tail(name, TAIL_LINES))
            self.say(
                f"{name}: failed ({recent} exits within {CRASH_LOOP_WINDOW_S:.0f}s, last "
                f"{code}); not restarting it, the rest keeps serving. Its last log lines:\n{tail}"
            )
            return
        delay = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (recent - 1))
        child.restart_at = now + delay
        self.say(f"{name}: exited with {code}; restarting in {delay:.1f}s")

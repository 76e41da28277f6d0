"""`conveyor up` keeps its pipeline serving: a child that exits (a worker, the producer, the
embedded Valkey) is started again after an exponential backoff (`shared.restart_backoff`, the
policy `conveyor autoscale` follows too), since the queue design survives a dead process (its
jobs are reclaimed), and once what it left running in its process group is gone (the killed
Valkey wrapper's server held the port and the data: every restart failed on them). A child that
keeps dying (`CRASH_LOOP_EXITS` runs in a row that each ended within `STABLE_AFTER_S` of their
start) is given up on and reported with its last log lines, while every other child keeps
serving, unless none can (`Supervisor.serving`)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from conveyor.stack import Stack
from shared.restart_backoff import STABLE_AFTER_S, RestartBackoff
from workers.runtime.memory_ceiling import RECYCLED

CRASH_LOOP_EXITS = 5
TAIL_LINES = 20


@dataclass
class Child:
    """One supervised process's current run, its crash loop so far and its pending restart."""

    started_at: float
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    restart_at: float | None = None
    failed: bool = False


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
        """One look at every child: note exits, restart those whose backoff is over and whose
        exited run's processes are gone (`Stack.lingering`; never waited for here); and rotate
        the logs grown past their cap (`Stack.cap_logs`)."""
        self.stack.cap_logs()
        now = self.clock()
        for name, process in list(self.stack.processes.items()):
            child = self.children.setdefault(name, Child(started_at=now))
            if child.failed:
                self.stack.lingering(name)  # its group seen gone soon, not signalled at stop
                continue
            if child.restart_at is not None:
                if now >= child.restart_at and not self.stack.lingering(name):
                    self._restart(name, child, now)
                continue
            code = process.poll()
            if code is not None:
                self._exited(name, child, code, now)

    @property
    def failed(self) -> list[str]:
        return [name for name, child in self.children.items() if child.failed]

    @property
    def serving(self) -> bool:
        """Whether the stack can still serve: not once its embedded Valkey, which every other
        child needs, or all its producers, its only way in, were given up on. `conveyor up`
        then stops, failed: it idled on, answering nothing, and a service manager saw it
        running, so never restarted it."""
        failed = set(self.failed)
        producers = {name for name in self.stack.processes if self.stack.producer(name)}
        return "valkey" not in failed and not (producers and producers <= failed)

    def _restart(self, name: str, child: Child, now: float) -> None:
        """Start `name` again. One that cannot be started (its program gone while the
        virtualenv is reinstalled, no process to be had) is a run that ended at once: its
        OSError ended `up` with a traceback, and every other child with it."""
        child.restart_at, child.started_at = None, now
        try:
            pid = self.stack.respawn(name).pid
        except OSError as exc:
            self._ended(name, child, f"could not be started ({exc})", str(exc), now)
            return
        self.say(f"{name}: restarted (pid {pid})")

    def _exited(self, name: str, child: Child, code: int, now: float) -> None:
        self.stack.exited(name)
        if code < 0:  # Popen's returncode for a death by signal: -9 read as an exit status
            signal_name = _signal_name(-code)
            self._ended(name, child, f"was killed by {signal_name}", signal_name, now)
        else:
            self._ended(name, child, f"exited with {code}{_why(code)}", str(code), now)

    def _ended(self, name: str, child: Child, how: str, last: str, now: float) -> None:
        """Count a run that ended (`how`, in short `last`) in the crash loop: restart it after
        its backoff, or give it up once the loop is long enough."""
        delay = child.backoff.exited(now - child.started_at)
        if child.backoff.failures >= CRASH_LOOP_EXITS:
            child.failed = True
            tail = "\n".join(f"  | {line}" for line in self.stack.log_tail(name, TAIL_LINES))
            self.say(
                f"{name}: failed ({child.backoff.failures} exits in a row, none up "
                f"{STABLE_AFTER_S:.0f}s; last {last}); not restarting it, the rest keeps serving. "
                f"Its last log lines:\n{tail}"
            )
            return
        child.restart_at = now + delay
        self.say(f"{name}: {how}; restarting in {delay:.1f}s")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name here
        return f"signal {number}"


def _why(code: int) -> str:
    """What an exit status a worker gives on purpose means, for the line that reports it."""
    return (
        " (recycled: its memory passed CONVEYOR_WORKER_MAX_MEMORY_MB)" if code == RECYCLED else ""
    )

"""How long a process that keeps exiting waits before it is started again, one policy for
`conveyor up`'s supervisor and `conveyor autoscale` alike, as Kubernetes restarts a container
in CrashLoopBackOff: each exit in a row that came within `STABLE_AFTER_S` of its start doubles
the wait, from `FIRST_BACKOFF_S` up to `MAX_BACKOFF_S`; a run that lasted that long ends the
crash loop, whether it then exited or was stopped, and the next exit waits the first delay
again. Neither caller can tell when a restarted process is ready, so time up stands for it."""

from __future__ import annotations

from dataclasses import dataclass

STABLE_AFTER_S = 60.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0


@dataclass
class RestartBackoff:
    """One crash loop so far: its exits in a row and the wait they earned."""

    failures: int = 0  # runs in a row that ended before STABLE_AFTER_S
    delay_s: float = 0.0

    def stopped(self, ran_s: float) -> None:
        """Count a run stopped on purpose (a scale-down) after `ran_s` seconds up: one that
        lasted `STABLE_AFTER_S` ends the crash loop as its exit would have; a shorter one,
        neither failed nor proven, leaves the loop as it was. (Left out, a pool that
        crash-looped once waited its longest at the first exit after hours of healthy runs.)"""
        if ran_s >= STABLE_AFTER_S:
            self.failures = 0

    def exited(self, ran_s: float) -> float:
        """Count an exit after `ran_s` seconds up; returns the wait before the next start. The
        count, unlike a window of recent exits, keeps growing for a process whose every slow
        start fails; the wait doubles from the last rather than from the count, so it never
        overflows however long the loop lasts."""
        self.stopped(ran_s)
        self.failures += 1
        doubled = FIRST_BACKOFF_S if self.failures == 1 else 2 * self.delay_s
        self.delay_s = min(MAX_BACKOFF_S, doubled)
        return self.delay_s

    def why(self) -> str:
        """The rule behind the wait, for a message that says why a start waits."""
        return (
            f"crash loop exit {self.failures}: the wait doubles with each exit within "
            f"{STABLE_AFTER_S:.0f}s of its start, up to {MAX_BACKOFF_S:.0f}s"
        )

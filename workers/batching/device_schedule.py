"""When a staged engine's device will want its next micro-batch, so that the batching loop reads
it just in time rather than as soon as the last one is queued. A micro-batch read early holds the
jobs that were next in line when it was read: a job arriving after that read (a quiet tenant's,
beside a flood) waits for one more micro-batch. Part F measured that wait: B's end-to-end p50
beside a flood rose from 16-28 ms to 39-45 ms once minilm's engine was staged. The estimates are
decaying averages of what the device, and the read and host stage before it, actually took."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

WEIGHT = 0.2  # of the newest sample in each average
# The lead asked for: the read and host stage's average, with room for one that runs long.
LEAD_FACTOR = 1.5
LEAD_SLACK_S = 0.002


class DeviceSchedule:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.run_s: float | None = None  # a micro-batch's time on the device
        self.lead_s = 0.0  # from asking for a micro-batch to handing it to the device
        self.busy_until = 0.0  # when the device should be done with all it was given
        self.pending = 0  # micro-batches given to the device and not done
        self._asked: float | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    async def until_wanted(self) -> None:
        """Return once the device is idle, or due to be within the lead of it."""
        wait = self.busy_until - (LEAD_FACTOR * self.lead_s + LEAD_SLACK_S) - self.clock()
        if self.pending and wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), wait)
        self._asked = self.clock()

    def given(self) -> None:
        """A micro-batch was read and prepared and is queued for the device. A read that found
        nothing and blocked counts for at most one run: it only makes the next read earlier."""
        now = self.clock()
        if self._asked is not None:
            lead = now - self._asked
            self.lead_s = _averaged(self.lead_s, min(lead, self.run_s or lead))
            self._asked = None
        self.busy_until = max(now, self.busy_until) + (self.run_s or 0.0)
        self.pending += 1
        self._idle.clear()

    def done(self, run_s: float | None) -> None:
        """A micro-batch left the device after `run_s` on it (None: not measured)."""
        if run_s is not None:
            self.run_s = run_s if self.run_s is None else _averaged(self.run_s, run_s)
        self.pending -= 1
        if self.pending == 0:
            self.busy_until = self.clock()
            self._idle.set()


def _averaged(average: float, sample: float) -> float:
    return average + WEIGHT * (sample - average)

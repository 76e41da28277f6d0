"""Redis's clock, the one every producer and worker reaches, as this process reads it: its own
clock less the skew last measured against Redis's TIME. Producers stamp a job (its enqueue, its
`ttl_s`) and workers judge it (expired at read?) on their own hosts' clocks: a worker 30 s ahead
of its producers expired every job whose `max_queue_time_s` was shorter, one behind ran jobs
past their deadlines. Judged on one clock, hosts agree whatever their own clocks say.

The skew is measured periodically (a worker's heartbeat, a producer's `redis-clock` loop),
never per job: stamping stays a read of the host clock. A skew within the measurement's
uncertainty (half the TIME round trip) or below APPLY_S is not applied, so a healthy host's
stamps do not jitter with each measurement; before the first one the host clock stands. Each
measure also tells the log when the clocks drift apart (ClockSkew), on producers and workers
alike, as Celery warns of a drift between its workers' clocks: the correction is only as good as
the last measure, NTP is the cure."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# Below this, a skew is noise to a job's queue time and deadline (NTP keeps hosts within ms).
APPLY_S = 0.1
EVERY_S = 30.0  # how often a process measures (one TIME)
SKEW_WARN_S = 1.0  # past this (beyond the round trip's own uncertainty), the log says so
# Within this once warned, they agree again: a skew about SKEW_WARN_S, measured either side of
# it from one check to the next, warned and took it back every minute while it lasted.
AGREE_S = SKEW_WARN_S / 2


@dataclass(frozen=True, slots=True)
class Skew:
    """This host's clock less Redis's, and how far off that measure may be (half the round
    trip: Redis read its clock somewhen between the two host reads)."""

    skew_s: float
    uncertainty_s: float


async def measure(client: Any) -> Skew:
    """One TIME: this host's clock less Redis's, read about the reply's middle."""
    before = time.time()
    seconds, micros = await client.time()
    after = time.time()
    redis_s = int(seconds) + int(micros) / 1_000_000
    return Skew((before + after) / 2 - redis_s, (after - before) / 2)


class RedisClock:
    """The host clock corrected by the skew last adopted (none until one is)."""

    def __init__(self) -> None:
        self.skew_ns = 0  # applied: the host clock less Redis's, in ns

    def adopt(self, measured: Skew) -> None:
        """Apply `measured`, or no correction when it is within its uncertainty or APPLY_S. A
        correction in force that the measure bears out (within its uncertainty and APPLY_S)
        stands: a slow TIME (a stalled event loop, a busy server) read the skew off by up to
        half its round trip, which a host 0.5 s off adopted (0.8 s after a 0.6 s stall), or
        dropped (its skew within that uncertainty), for the next EVERY_S of stamps."""
        skew_s, uncertainty_s = measured.skew_s, measured.uncertainty_s
        if abs(skew_s - self.skew_ns / 1e9) <= uncertainty_s + APPLY_S:
            return
        applies = abs(skew_s) > APPLY_S and abs(skew_s) > uncertainty_s
        self.skew_ns = round(skew_s * 1e9) if applies else 0

    def now_ns(self) -> int:
        """Redis's time as this host reads it, in ns since the epoch."""
        return time.time_ns() - self.skew_ns

    def now(self) -> float:
        """Redis's time as this host reads it, in seconds since the epoch."""
        return self.now_ns() / 1e9


CLOCK = RedisClock()  # this process's: the heartbeat or the producer's loop keeps it adopted


class ClockSkew:
    """Compares this host's clock with Redis's: one warning when they drift apart by more than
    SKEW_WARN_S, another whenever the skew moves that far from the one last told (a failover to
    a Redis on another host, a clock stepped), one line when they agree again, within AGREE_S.
    A worker's heartbeat `check`s every `every_s`; a producer's `redis-clock` loop, which keeps
    its own pace, `sync`s (a producer far off Redis's clock stamped its jobs' times on a
    corrected clock and never said its host was off)."""

    def __init__(self, every_s: float = EVERY_S, corrects: RedisClock | None = None) -> None:
        """`corrects`: the clock each measure is adopted by (the process's); None: the skew is
        only told."""
        self.every_s = every_s
        self.corrects = corrects
        self.skew_s: float | None = None  # the last measure's: this clock less Redis's
        self.told: float | None = None  # the skew the log last warned of, while they disagree
        self._due = 0.0

    async def check(self, client: Any) -> float | None:
        """This clock minus Redis's, in seconds, when a check was due (None otherwise)."""
        if time.monotonic() < self._due:
            return None
        await self.sync(client)  # one that failed (Redis away) is tried again at the next beat
        self._due = time.monotonic() + self.every_s
        return self.skew_s

    async def sync(self, client: Any) -> None:
        """Measure the skew now (one TIME), adopt it by the clock corrected, and tell the log."""
        measured = await measure(client)
        if self.corrects is not None:
            self.corrects.adopt(measured)
        self.skew_s = measured.skew_s
        self._tell(measured)

    def _tell(self, measured: Skew) -> None:
        skew, uncertainty_s = measured.skew_s, measured.uncertainty_s
        bound_s = SKEW_WARN_S + uncertainty_s
        if abs(skew) > bound_s:
            # a skew that jumped (from ahead to behind, say) made the one told a wrong account
            if self.told is None or abs(skew - self.told) > bound_s:
                log.warning(
                    "this host's clock is %+.1fs off Redis's: jobs' times are stamped and "
                    "judged on Redis's, corrected by the skew measured every %gs (off by any "
                    "drift since); check NTP",
                    skew,
                    self.every_s,
                )
                self.told = skew
        elif self.told is not None and abs(skew) <= AGREE_S + uncertainty_s:
            log.warning("this host's clock agrees with Redis's again (%+.3fs)", skew)
            self.told = None


async def adopt_redis_clock(client: Any) -> None:
    """Measure Redis's clock once (one TIME) and correct this process's CLOCK by it: for a
    one-off command (the CLI's), which has no heartbeat or loop to keep it measured, yet
    stamps and judges as producers do (an operator's laptop a minute off wrote a key's times a
    minute off)."""
    await ClockSkew(corrects=CLOCK).sync(client)

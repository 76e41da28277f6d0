"""Redis's clock, the one every producer and worker reaches, as this process reads it: its own
clock less the skew last measured against Redis's TIME. Producers stamp a job (its enqueue, its
`ttl_s`) and workers judge it (expired at read?) on their own hosts' clocks: a worker 30 s ahead
of its producers expired every job whose `max_queue_time_s` was shorter, one behind ran jobs
past their deadlines. Judged on one clock, hosts agree whatever their own clocks say.

The skew is measured periodically (a worker's heartbeat, a producer's `redis-clock` loop),
never per job: stamping stays a read of the host clock. A skew within the measurement's
uncertainty (half the TIME round trip) or below APPLY_S is not applied, so a healthy host's
stamps do not jitter with each measurement; before the first one the host clock stands."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# Below this, a skew is noise to a job's queue time and deadline (NTP keeps hosts within ms).
APPLY_S = 0.1
EVERY_S = 30.0  # how often a process measures (one TIME)


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
        """Apply `measured`, or no correction when it is within its uncertainty or APPLY_S."""
        off_s = abs(measured.skew_s)
        applies = off_s > APPLY_S and off_s > measured.uncertainty_s
        self.skew_ns = round(measured.skew_s * 1e9) if applies else 0

    async def sync(self, client: Any) -> None:
        """Measure the skew (one TIME) and adopt it: a producer's periodic step."""
        self.adopt(await measure(client))

    def now_ns(self) -> int:
        """Redis's time as this host reads it, in ns since the epoch."""
        return time.time_ns() - self.skew_ns

    def now(self) -> float:
        """Redis's time as this host reads it, in seconds since the epoch."""
        return self.now_ns() / 1e9


CLOCK = RedisClock()  # this process's: the heartbeat or the producer's loop keeps it adopted

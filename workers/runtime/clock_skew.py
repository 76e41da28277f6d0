"""A worker's own clock decided whether a job it read had passed its deadline or its queue
time (the producers stamped them with theirs): a worker whose clock ran 11 minutes fast expired
50 of 50 jobs, every one as if on time, and one running slow ran jobs past their deadlines.
Redis's clock, which every producer and worker reaches, is the reference: the heartbeat thread
measures the skew now and then, corrects the process's stamps and judgements by it
(shared/redis_clock.py), and says so in the log when the clocks drift apart, as Celery warns of
a drift between its workers' clocks: the correction is as good as the last measure, NTP is the
cure."""

from __future__ import annotations

import logging
import time
from typing import Any

from shared.redis_clock import EVERY_S, RedisClock, measure

log = logging.getLogger(__name__)

SKEW_WARN_S = 1.0  # past this (beyond the round trip's own uncertainty), the log says so
# Within this once warned, they agree again: a skew about SKEW_WARN_S, measured either side of
# it from one check to the next, warned and took it back every minute while it lasted.
AGREE_S = SKEW_WARN_S / 2


class ClockSkew:
    """Compares this host's clock with Redis's every `every_s`: one warning when they drift
    apart by more than SKEW_WARN_S, another whenever the skew moves that far from the one last
    told (a failover to a Redis on another host, a clock stepped), one line when they agree
    again, within AGREE_S."""

    def __init__(self, every_s: float = EVERY_S, corrects: RedisClock | None = None) -> None:
        """`corrects`: the clock each measure is adopted by (the process's, from the heartbeat);
        None: the skew is only told."""
        self.every_s = every_s
        self.corrects = corrects
        self.told: float | None = None  # the skew the log last warned of, while they disagree
        self._due = 0.0

    async def check(self, client: Any) -> float | None:
        """This clock minus Redis's, in seconds, when a check was due (None otherwise)."""
        if time.monotonic() < self._due:
            return None
        self._due = time.monotonic() + self.every_s
        measured = await measure(client)
        if self.corrects is not None:
            self.corrects.adopt(measured)
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
        return skew

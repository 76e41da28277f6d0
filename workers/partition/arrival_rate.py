"""How fast jobs reach a partition, so its loop holds a micro-batch open for more jobs only while
more are likely to come: an idle partition serves a lone job at once. Two decaying estimates:
the rate the worker reads jobs at, and what holding a micro-batch open actually gained against
what that rate expected of it. The second matters because the overall rate can mislead: a
client at concurrency 1 sends its next job only after this one's answer, so nothing arrives
while its job waits, whatever the rate. It corrects the rate, rather than standing for one of
its own: as a rate, what waits gained outlived the traffic (both its counts decay alike), and
seconds after the last job a lone one still waited for more."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

HALF_LIFE_S = 1.0  # evidence older than a few seconds no longer counts
PRIOR_S = 0.01  # how much waiting the overall rate is worth, against what waits gained


class ArrivalRate:
    def __init__(
        self,
        half_life_s: float = HALF_LIFE_S,
        prior_s: float = PRIOR_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.half_life_s = half_life_s
        self.prior_s = prior_s
        self.clock = clock
        self._at = clock()
        self._arrived = 0.0  # decayed count of jobs read
        self._gained = 0.0  # decayed count of jobs gained while holding a micro-batch open
        self._expected = 0.0  # decayed count of jobs the overall rate expected of those waits

    def arrived(self, count: int) -> None:
        """`count` jobs were read (any read: the first of a micro-batch or a top-up)."""
        self._decay()
        self._arrived += count

    def waited(self, seconds: float, gained: int) -> None:
        """A micro-batch was held open `seconds` and gained `gained` jobs meanwhile."""
        self._expected += self.overall() * seconds
        self._gained += gained

    def overall(self) -> float:
        """Jobs per second read lately (a steady rate r converges to r)."""
        self._decay()
        return self._arrived * math.log(2) / self.half_life_s

    def while_waiting(self) -> float:
        """Jobs per second expected while a micro-batch is held open: the overall rate, times
        what recent waits gained for each job it expected of them, with a prior of `prior_s`
        of waiting that gained what the rate expected (none: the rate as it is)."""
        overall = self.overall()
        prior = overall * self.prior_s
        expected = self._expected + prior
        # none: no waits and no prior, or a silence long enough to leave nothing of either
        return overall * (self._gained + prior) / expected if expected > 0.0 else overall

    def expects_more(self, within_s: float) -> bool:
        """Whether at least one more job is expected within `within_s` seconds."""
        return self.while_waiting() * within_s >= 1.0

    def _decay(self) -> None:
        now = self.clock()
        factor = 0.5 ** ((now - self._at) / self.half_life_s)
        self._at = now
        self._arrived *= factor
        self._gained *= factor
        self._expected *= factor

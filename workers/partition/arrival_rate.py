"""How fast jobs reach a partition, so its loop holds a micro-batch open for more jobs only while
more are likely to come: an idle partition serves a lone job at once. Two decaying estimates:
the rate the worker reads jobs at, and what holding a micro-batch open actually gained. The
second matters because the overall rate can mislead: a client at concurrency 1 sends its next
job only after this one's answer, so nothing arrives while its job waits, whatever the rate."""

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
        self._waited = 0.0  # decayed seconds spent holding one open

    def arrived(self, count: int) -> None:
        """`count` jobs were read (any read: the first of a micro-batch or a top-up)."""
        self._decay()
        self._arrived += count

    def waited(self, seconds: float, gained: int) -> None:
        """A micro-batch was held open `seconds` and gained `gained` jobs meanwhile."""
        self._decay()
        self._waited += seconds
        self._gained += gained

    def overall(self) -> float:
        """Jobs per second read lately (a steady rate r converges to r)."""
        self._decay()
        return self._arrived * math.log(2) / self.half_life_s

    def while_waiting(self) -> float:
        """Jobs per second expected while a micro-batch is held open: what recent waits gained,
        with the overall rate as the prior (worth `prior_s` of waiting)."""
        overall = self.overall()
        return (self._gained + overall * self.prior_s) / (self._waited + self.prior_s)

    def expects_more(self, within_s: float) -> bool:
        """Whether at least one more job is expected within `within_s` seconds."""
        return self.while_waiting() * within_s >= 1.0

    def _decay(self) -> None:
        now = self.clock()
        factor = 0.5 ** ((now - self._at) / self.half_life_s)
        self._at = now
        self._arrived *= factor
        self._gained *= factor
        self._waited *= factor

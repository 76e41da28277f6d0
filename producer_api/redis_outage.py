"""A producer background loop's view of a Redis outage: one warning when Redis goes away and
one when it is back, not one per retry (a 100 ms poller would otherwise log ten lines a second),
and a capped exponential backoff between its retries. The workers' side of the same rule lives
in `workers/partition/redis_backoff.py`."""

from __future__ import annotations

import logging
import math
import time

from redis.exceptions import AuthenticationError

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.1
MAX_RETRY_S = 5.0
# Doublings that reach the cap: counted further, 2**failures made a float overflow (an
# OverflowError at the 1,025th retry, which ended the loop that asked, silently, for good).
_DOUBLINGS = math.ceil(math.log2(MAX_RETRY_S / FIRST_RETRY_S))


class RedisOutage:
    def __init__(self, name: str) -> None:
        self.name = name
        self.failures = 0
        self._since = 0.0

    def failed(self, error: BaseException) -> float:
        """Count a failed attempt (logging the outage's start once); returns the seconds to
        wait before the next one."""
        if not self.failures:
            self._since = time.monotonic()
            log.warning(
                "%s: redis unavailable (%s); retrying with backoff", self.name, named(error)
            )
        else:
            log.debug("%s: redis still unavailable (%s)", self.name, named(error))
        delay = min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** min(self.failures, _DOUBLINGS))
        self.failures += 1
        return delay

    def recovered(self) -> None:
        """Redis answered: log the outage's end, once."""
        if self.failures:
            down_s = time.monotonic() - self._since
            log.warning("%s: redis reachable again after %.1fs", self.name, down_s)
            self.failures = 0


def named(error: BaseException) -> str:
    """An error as a log or a probe names it: its repr, but credentials Redis refuses said as
    such, with the server's words. redis-py's repr of its errors is their class alone, and a
    refused login (a ConnectionError) read "auth:AuthenticationError", an outage's name."""
    if isinstance(error, AuthenticationError):
        return f"credentials refused: {error}"
    return repr(error)

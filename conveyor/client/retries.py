"""When to try a request again: on 429 (refused before anything was done; not a deadline the
queue cannot meet, which the same request never passes) and on 503, 502 and 504 when
repeating the request cannot do anything twice (a 503 may come after the job was written; a
proxy's 502 or 504 may come after the producer took the request), never on an answer that
says `x-should-retry: false`,
after `Retry-After` when the server gives one, else exponential backoff with full jitter; on a
409 that carries `Retry-After` (an idempotent submit whose first try is still being enqueued);
and on transport errors when repeating the request cannot do anything twice. Sans I/O: the
sync and async clients only sleep where it says."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from conveyor.client.errors import InvalidArgument, WireError
from shared.retry_after import retry_after_s as parse_retry_after

REFUSED = 429
# A draining producer's 503, or a proxy's answer while the producer behind it restarts.
UNAVAILABLE = frozenset({502, 503, 504})
# Transport errors raised before any byte of the request went out.
NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_MAX_DOUBLINGS = 1023  # 2.0**1024 is past the largest float


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """Passed to `on_retry` before each pause: which try failed, why, and how long we wait."""

    attempt: int
    delay_s: float
    reason: str
    retry_after_s: float | None = None  # what the server asked for, when it said


OnRetry = Callable[[RetryEvent], None]


def retry_after_s(headers: httpx.Headers) -> float | None:
    """`Retry-After` as seconds (a number, a fraction allowed, or an HTTP date), or None."""
    value = headers.get("Retry-After")
    return None if value is None else parse_retry_after(value)


def _hopeless(response: httpx.Response, asked: float | None) -> bool:
    """A 429 that the same request can never pass: a job whose absolute deadline the queue
    cannot meet (its deadline nears as fast as the queue drains; the server then names no
    Retry-After)."""
    if asked is not None:
        return False
    try:
        kind = response.json()["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return False
    return bool(kind == "deadline_unmeetable")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 5
    base_s: float = 0.5
    cap_s: float = 30.0
    max_retry_after_s: float = 300.0
    # All a call's retries end within this many seconds of its start: five Retry-Afters of
    # 300 s each kept a call with no timeout of its own retrying for 25 minutes.
    max_total_s: float = 300.0

    def __post_init__(self) -> None:
        """Refused when made: a negative `base_s` or `cap_s` drew a negative pause, which
        `time.sleep` raised as ValueError at the first retry; a NaN `max_retry_after_s`
        capped nothing."""
        for name in ("max_retries", "base_s", "cap_s", "max_retry_after_s", "max_total_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise InvalidArgument(f"RetryPolicy {name} {value!r}: 0 or more")

    def deadline(self, own: float | None) -> float:
        """The monotonic time after which no retry of a call starting now is made: its own
        deadline (a wait's timeout), or `max_total_s` from now if sooner."""
        total = time.monotonic() + self.max_total_s
        return total if own is None else min(own, total)

    def backoff_s(self, attempt: int) -> float:
        """Full jitter (uniform up to the exponential step) spreads out clients that failed
        together, which is what a 429 or 503 usually means. The step doubles 1023 times at
        most: `2**1024` overflowed a float at a policy's 1024th retry."""
        step = self.base_s * 2.0 ** min(attempt, _MAX_DOUBLINGS)
        return random.uniform(0, min(self.cap_s, step))

    def after_response(
        self,
        attempt: int,
        response: httpx.Response,
        repeatable: bool,
        deadline: float | None = None,
    ) -> RetryEvent | None:
        """The pause before retry number `attempt + 1`, or None to accept `response`. A 503
        (502, 504) to a request that is not `repeatable` (a POST without an Idempotency-Key) is
        accepted: the server may have enqueued its job before failing, and a retry would
        enqueue another. No
        retry ends past `deadline` (monotonic; a wait's own timeout)."""
        return _before(deadline, self._after_response(attempt, response, repeatable))

    def _after_response(
        self, attempt: int, response: httpx.Response, repeatable: bool
    ) -> RetryEvent | None:
        asked = retry_after_s(response.headers)
        status = response.status_code
        if response.headers.get("x-should-retry") == "false":  # the server says so, as OpenAI's
            return None
        retryable = (
            (status == REFUSED and not _hopeless(response, asked))
            or (status in UNAVAILABLE and repeatable)
            or (status == 409 and asked is not None)  # the server says when: not a clash
        )
        if not retryable or attempt >= self.max_retries:
            return None
        if asked is None:
            delay = self.backoff_s(attempt)
        elif asked > self.max_retry_after_s:
            return None
        else:
            # never earlier than asked; a little later, so clients told the same do not collide
            delay = asked + random.uniform(0, min(1.0, asked * 0.1))
        return RetryEvent(attempt + 1, delay, f"HTTP {response.status_code}", asked)

    def after_error(
        self,
        attempt: int,
        error: WireError,
        repeatable: bool,
        deadline: float | None = None,
    ) -> RetryEvent | None:
        """A request that never reached the server (connect failed, or no pooled connection
        came free in time) is always safe to send again; one that may have arrived only if
        sending it twice does no harm. No retry ends past `deadline`."""
        never_sent = isinstance(error, NEVER_SENT)
        if attempt >= self.max_retries or not (never_sent or repeatable):
            return None
        pause = RetryEvent(attempt + 1, self.backoff_s(attempt), f"{type(error).__name__}")
        return _before(deadline, pause)


def _before(deadline: float | None, pause: RetryEvent | None) -> RetryEvent | None:
    """`pause`, unless the retry after it would start past `deadline`: a wait's timeout held
    only between its polls, and its retries slept out a server's Retry-After (up to 300 s, five
    times over) past it."""
    if pause is None or deadline is None or time.monotonic() + pause.delay_s < deadline:
        return pause
    return None

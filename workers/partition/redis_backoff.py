"""Capped exponential backoff with jitter for Redis outages: workers keep their consumer name
(and so their pending entries) and resume by themselves when the server is back. A backoff
logs one line when Redis goes away and one when it is back, not one per retry, and its sleeps
end as soon as the loop is asked to stop, so a worker whose Redis is gone still exits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.redis_client import CLUSTER_OUTAGE, WRITES_REFUSED

log = logging.getLogger(__name__)

T = TypeVar("T")
# A Redis that refuses writes for a while (out of memory, a failover's old master) is waited out
# like one that is unreachable, results in hand (it stopped the consumer before).
OUTAGE = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    *WRITES_REFUSED,
    *CLUSTER_OUTAGE,
)


# A thread that wakes every PAUSE_WATCH_S and was PAUSED_S late or more saw this process not run
# (a scheduler's jitter is milliseconds); a timeout up to PAUSE_SEEN_S after such a pause ended
# is the pause's, not Redis's (at a thaw both fire within milliseconds).
PAUSE_WATCH_S = 0.5
PAUSED_S = 1.0
PAUSE_SEEN_S = 1.0


class PauseWatch:
    """How long this process last went without running (SIGSTOP, a paused container, a debugger,
    a VM migrated): its calls' timeouts ran out meanwhile, Redis's answers unread in the socket,
    and the thawed worker blamed Redis. A daemon thread notes how late it wakes, so a call that
    succeeds pays nothing; read only when a call failed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.awake_at = time.monotonic()
        self.last = (0.0, 0.0)  # the last pause seen: (monotonic time it ended, seconds)

    def start(self) -> None:
        """Watch from now on (once per process; a forked child starts its own)."""
        if self.thread is not None:
            return
        with self.lock:
            if self.thread is None:
                self.awake_at = time.monotonic()
                self.thread = threading.Thread(target=self._watch, name="pause-watch", daemon=True)
                self.thread.start()

    def forked(self) -> None:
        """In a forked child: the parent's thread is not there to watch."""
        self.lock = threading.Lock()
        self.thread = None

    def _watch(self) -> None:
        while True:
            time.sleep(PAUSE_WATCH_S)
            now = time.monotonic()
            if (late := now - self.awake_at - PAUSE_WATCH_S) >= PAUSED_S:
                self.last = (now, late)  # before awake_at: a reader in between sees it unseen
            self.awake_at = now

    def paused_s(self) -> float | None:
        """Seconds this process was just paused: a pause the thread has not woken from yet (the
        caller woke first), or one that ended within PAUSE_SEEN_S; None when it ran on."""
        if self.thread is None:
            return None
        now = time.monotonic()
        if (unseen := now - self.awake_at - PAUSE_WATCH_S) >= PAUSED_S:
            return unseen
        ended_at, lasted = self.last
        return lasted if lasted and now - ended_at <= PAUSE_SEEN_S else None


PAUSES = PauseWatch()
os.register_at_fork(after_in_child=PAUSES.forked)


class Stopped(Exception):
    """Asked to stop while Redis was unreachable: what was in hand stays unacknowledged, so
    another worker reclaims and reruns it."""


class OutageSpell:
    """An outage from its first failure to its end, the failures between counted, not logged:
    an outage is two log lines however many retries it takes (also Celery's broker connection's,
    workers/runtime/broker_outage_log.py)."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.repeats = 0

    def failed(self) -> bool:
        """Count a failure; True for the first of a spell, the one to log."""
        if self.since is None:
            self.since = time.monotonic()
            return True
        self.repeats += 1
        return False

    def ended(self) -> tuple[float, int] | None:
        """(seconds it lasted, failures after its first) of the spell now over; None if none
        was under way."""
        if self.since is None:
            return None
        spell = (time.monotonic() - self.since, self.repeats)
        self.since, self.repeats = None, 0
        return spell


class OutageLog:
    """One warning when Redis goes away and one when it answers again."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.spell = OutageSpell()
        PAUSES.start()

    def failed(self, reason: BaseException) -> None:
        if (paused_s := self._paused_s(reason)) is not None:
            log.warning(
                "%s: this process was paused for at least %.1fs (stopped, frozen or starved of "
                "CPU), so a redis call timed out meanwhile (%s); retrying",
                self.what,
                paused_s,
                reason,
            )
            return
        if self.spell.failed():
            log.warning("%s: redis unavailable (%s); retrying with backoff", self.what, reason)
        else:
            log.debug("%s: redis still unavailable (%s)", self.what, reason)

    def _paused_s(self, reason: BaseException) -> float | None:
        """How long this process was just paused, when that is why `reason` came: a timeout
        that starts no spell (one under way is Redis's: the pause counts among its retries).
        Not a spell either: the retry that fails too starts one, Redis's fault after all."""
        if self.spell.since is not None or not isinstance(reason, RedisTimeoutError):
            return None
        return PAUSES.paused_s()

    def recovered(self) -> None:
        if (ended := self.spell.ended()) is not None:
            log.warning("%s: redis reachable again after %.1fs", self.what, ended[0])


class Backoff:
    def __init__(
        self, stop: asyncio.Event, what: str, first_s: float = 0.1, cap_s: float = 5.0
    ) -> None:
        self.stop = stop
        self.first_s = first_s
        self.cap_s = cap_s
        self.attempt = 0
        self.outage = OutageLog(what)

    def reset(self) -> None:
        """Redis answered."""
        self.outage.recovered()
        self.attempt = 0

    async def sleep(self, reason: BaseException) -> None:
        """Wait before the next retry, or less if asked to stop meanwhile."""
        delay = min(self.cap_s, self.first_s * 2**self.attempt) * random.uniform(0.5, 1.0)
        self.outage.failed(reason)
        if self.first_s * 2**self.attempt < self.cap_s:  # at the cap it stays: 2**1024 overflowed
            self.attempt += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), delay)


async def until_done(call: Callable[[], Awaitable[T]], stop: asyncio.Event, what: str) -> T:
    """Retry `call` through an outage; for writes that must not be lost (a finished batch).
    Raises Stopped when asked to stop while Redis is still unreachable."""
    backoff = Backoff(stop, what)
    while True:
        try:
            result = await call()
        except OUTAGE as exc:
            if stop.is_set():
                raise Stopped from exc
            await backoff.sleep(exc)
            continue
        backoff.reset()
        return result


async def serve_until_stopped(
    step: Callable[[], Awaitable[object]],
    stop: asyncio.Event,
    what: str,
    on_outage: Callable[[], None],
    going: Callable[[], bool] = lambda: True,
) -> None:
    """Run `step` over and over until asked to stop (or `going` says no more); an outage calls
    `on_outage` (a loop's lanes forget what they knew of the stream) and pauses the loop by
    backoff, so a worker rides out a Redis restart with its consumer name and entries."""
    backoff = Backoff(stop, what)
    while not stop.is_set() and going():
        try:
            await step()
            backoff.reset()
        except OUTAGE as exc:
            on_outage()
            await backoff.sleep(exc)
        except Stopped:
            return

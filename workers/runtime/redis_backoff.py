"""Capped exponential backoff with jitter for Redis outages: workers keep their consumer name
(and so their pending entries) and resume by themselves when the server is back."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

T = TypeVar("T")
OUTAGE = (RedisConnectionError, RedisTimeoutError, BusyLoadingError)


class Backoff:
    def __init__(self, first_s: float = 0.1, cap_s: float = 5.0) -> None:
        self.first_s = first_s
        self.cap_s = cap_s
        self.attempt = 0

    def reset(self) -> None:
        self.attempt = 0

    async def sleep(self, reason: BaseException) -> None:
        delay = min(self.cap_s, self.first_s * 2**self.attempt) * random.uniform(0.5, 1.0)
        self.attempt += 1
        log.warning("redis unavailable (%s); retrying in %.2fs", reason, delay)
        await asyncio.sleep(delay)


async def until_done(call: Callable[[], Awaitable[T]]) -> T:
    """Retry `call` through an outage; for writes that must not be lost (a finished batch)."""
    backoff = Backoff()
    while True:
        try:
            return await call()
        except OUTAGE as exc:
            await backoff.sleep(exc)

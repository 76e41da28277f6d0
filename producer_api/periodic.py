"""A producer background loop that runs one step every few moments until stopped, and survives
any error in a step (logged; Redis down is a warning), so a loop never dies with its first
failure. A step that keeps failing the same way is logged, with its traceback, once: the 100 ms
routes poll logged ten tracebacks a second for as long as a live routes document stayed
corrupt. Started and stopped by the app's lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

from producer_api.redis_outage import RedisOutage
from producer_api.task_cancel import cancel_and_wait

log = logging.getLogger(__name__)


class Periodic:
    def __init__(
        self,
        name: str,
        interval_s: float,
        step: Callable[[], Awaitable[None]],
        first_after_s: float = 0.0,
    ) -> None:
        """`first_after_s`: how long after `start` the first step runs (at once by default); a
        loop whose step the startup has just run waits a period, else the two run back to back
        (the `redis-clock` loop sent a second TIME as the producer started)."""
        self.name = name
        self.interval_s = interval_s
        self.step = step
        self.first_after_s = first_after_s
        self._task: asyncio.Task[None] | None = None
        self._fault: str | None = None  # how the last step failed, otherwise than by Redis

    async def run(self) -> None:
        outage = RedisOutage(self.name)
        if self.first_after_s > 0:
            await asyncio.sleep(self.first_after_s)
        while True:
            pause_s = self.interval_s
            try:
                await self.step()
                outage.recovered()
                self._fault = None
            except RedisError as exc:
                pause_s = max(pause_s, outage.failed(exc))
            except Exception as exc:
                self._failed(exc)
            await asyncio.sleep(pause_s)

    def _failed(self, exc: Exception) -> None:
        """Log a step's failure with its traceback, unless it is the one logged last with no
        good step since (then a debug line)."""
        fault = repr(exc)
        if fault == self._fault:
            log.debug("%s still failing (%s)", self.name, fault)
            return
        self._fault = fault
        log.error("%s failed; next step in %.1fs", self.name, self.interval_s, exc_info=exc)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=self.name)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

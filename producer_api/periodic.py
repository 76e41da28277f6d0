"""A producer background loop that runs one step every few moments until stopped, and survives
any error in a step (logged; Redis down is a warning), so a loop never dies with its first
failure. Started and stopped by the app's lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

from producer_api.redis_outage import RedisOutage
from producer_api.task_cancel import cancel_and_wait

log = logging.getLogger(__name__)


class Periodic:
    def __init__(self, name: str, interval_s: float, step: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.step = step
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        outage = RedisOutage(self.name)
        while True:
            pause_s = self.interval_s
            try:
                await self.step()
                outage.recovered()
            except RedisError as exc:
                pause_s = max(pause_s, outage.failed(exc))
            except Exception:
                log.exception("%s failed; next step in %.1fs", self.name, self.interval_s)
            await asyncio.sleep(pause_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=self.name)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

"""Background loop of every producer: finishes Batch API batches whose last item just ended and
expires those past their completion window, so neither waits for a client to look. Any number of
producers may sweep at once: counting is atomic and finalization happens once (Lua). Started
and stopped by the app's lifespan (`producer_api/app.py`)."""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from producer_api.batch_api.progress import BatchApiProgress
from producer_api.task_cancel import cancel_and_wait
from shared.batch_api_store import BatchApiStore, BatchStatus
from shared.job_store import now_ms

log = logging.getLogger(__name__)

INTERVAL_S = 1.0


class BatchApiSweeper:
    def __init__(self, store: BatchApiStore, progress: BatchApiProgress) -> None:
        self.store = store
        self.progress = progress
        self._task: asyncio.Task[None] | None = None

    async def sweep(self) -> None:
        now = now_ms()
        for batch_id, expires_ms in await self.store.active():
            if expires_ms <= now:
                await self.progress.end(batch_id, BatchStatus.EXPIRED)
            await self.progress.refresh(batch_id, window=0)

    async def run(self) -> None:
        while True:
            try:
                await self.sweep()
            except RedisError as exc:
                log.warning("batch sweep failed (%r); next in %.0fs", exc, INTERVAL_S)
            except Exception:
                log.exception("batch sweep failed; next in %.0fs", INTERVAL_S)
            await asyncio.sleep(INTERVAL_S)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="batch-sweeper")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

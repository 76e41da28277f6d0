"""Background loop of every producer: finishes batches whose last item just ended and expires
those past their completion window, so neither waits for a client to look. Any number of
producers may sweep at once: counting is atomic and finalization happens once (Lua)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from redis.exceptions import RedisError

from producer_api.batches.progress import BatchProgress
from producer_api.state import ProducerState
from shared.batch_store import BatchStatus, BatchStore
from shared.job_store import now_ms

log = logging.getLogger(__name__)

INTERVAL_S = 1.0


class Sweeper:
    def __init__(self, progress: BatchProgress) -> None:
        self.progress = progress

    async def sweep(self) -> None:
        now = now_ms()
        for batch_id, expires_ms in await self.progress.store.active():
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


@asynccontextmanager
async def batches_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Runs inside the app's lifespan (after ProducerState exists): the batches runtime."""
    state: ProducerState = app.state.conveyor
    store = BatchStore(state.redis, state.keys, state.settings.result_ttl_s)
    progress = BatchProgress(state, store)
    app.state.batches = progress
    task = asyncio.create_task(Sweeper(progress).run(), name="batch-sweeper")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

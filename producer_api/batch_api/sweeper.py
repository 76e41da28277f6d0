"""Background loop of every producer: finishes Batch API batches whose last item just ended,
expires those past their completion window, so neither waits for a client to look, and feeds
running batches' held items into their bulk lanes as room frees (`feeding.py`). Any number of
producers may sweep at once: counting is atomic, finalization happens once and a held item is
enqueued once (Lua). Started and stopped by the app's lifespan (`producer_api/app.py`)."""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from producer_api.batch_api.progress import BatchApiProgress
from producer_api.periodic import Periodic
from shared.batch_api_store import BatchApiStore, BatchStatus, HeldLane, Refresh, held_lanes
from shared.job_store import now_ms

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
COMPLETE_AFTER_MS = 10_000


class BatchApiSweeper:
    def __init__(self, store: BatchApiStore, progress: BatchApiProgress) -> None:
        self.store = store
        self.progress = progress
        self._loop = Periodic("batch sweeper", INTERVAL_S, self.sweep)

    async def sweep(self) -> None:
        """Each batch on its own: one whose keys Redis refuses (in a cluster, its slot's master
        down) is tried again next sweep, while the others still end and are fed; raised out of
        the loop, it held back every batch after it and every batch's feeding."""
        now = now_ms()
        held: list[HeldLane] = []
        for batch_id, expires_ms in await self.store.active():
            try:
                held.extend(await self._sweep_one(batch_id, expires_ms <= now, now))
            except RedisError as exc:
                log.warning(
                    "batch %s not swept (%r); next sweep in %.1fs", batch_id, exc, INTERVAL_S
                )
        await self.progress.feed(held)

    async def _sweep_one(self, batch_id: str, past_window: bool, now: int) -> list[HeldLane]:
        """Count, end or complete one batch; returns its held lanes to feed."""
        # counted first: a batch whose last item finished just before its window ran out,
        # with nobody looking, completes rather than expiring with every item done
        progress = await self.progress.refresh(batch_id, window=0)
        if progress is not None and (ending := _ending_due(progress, past_window)):
            await self.progress.end(batch_id, ending)
            progress = await self.progress.refresh(batch_id, window=0)
        if progress is None:
            await self.store.forget(batch_id)
        elif _left_by_its_finalizer(progress, now):
            # Ended, yet still indexed: its finalizer died between the batch's commit and
            # its webhook's hand-over or the release of its keys in other slots.
            await self.progress.complete(batch_id, progress)
        elif _feeds(progress):
            return held_lanes(progress.fields)
        return []

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()


def _feeds(progress: Refresh) -> bool:
    """Whether a batch's held items are to be fed: it runs and no end has been asked (one
    asked ends them, `BatchApiProgress.end`)."""
    fields = progress.fields
    return fields["status"] == BatchStatus.IN_PROGRESS and "ending" not in fields


def _left_by_its_finalizer(progress: Refresh, now: int) -> bool:
    """Ended COMPLETE_AFTER_MS ago or more and still indexed: a live finalizer completes its
    batch within milliseconds of the commit, and one the sweeper raced would send its webhook
    twice."""
    status = BatchStatus(progress.fields["status"])
    ended_at = int(progress.fields.get(f"{status.value}_at", 0))
    return status.terminal and not progress.finalize and now - ended_at >= COMPLETE_AFTER_MS


def _ending_due(progress: Refresh, past_window: bool) -> BatchStatus | None:
    """The end to apply to a batch still running once counted: one asked already (a cancel
    whose producer died between asking the end and settling the items, which then ran on until
    the window ran out), else expiry once its window has run out."""
    fields = progress.fields
    if fields["status"] != BatchStatus.IN_PROGRESS:
        return None
    if ending := fields.get("ending"):
        return BatchStatus(ending)
    return BatchStatus.EXPIRED if past_window else None

"""Feeds a Batch API batch's held items (those its bulk lane had no room for at create) into the
lane as room frees, run by every producer's sweeper: a batch of up to CONVEYOR_MAX_BATCH_LINES
is accepted whatever its lane holds, as OpenAI's is, and the lane never holds more than its
`queue.max_length`, so its backpressure on other submits stays as it is. Each sweep shares a
lane's room among the batches waiting on it, so two big batches both progress."""

from __future__ import annotations

from collections.abc import Sequence

from shared.batch_api_store import CHUNK, BatchApiStore, HeldLane
from shared.job_store import JobStore
from shared.metrics import JOBS_SUBMITTED


def shares(room: int, count: int, turn: int) -> list[int]:
    """`room` split among `count` waiters, the remainder to `room % count` of them from
    `turn` on, so a room smaller than the waiters goes round them sweep by sweep."""
    if room <= 0:
        return [0] * count
    base, extra = divmod(room, count)
    return [base + ((index - turn) % count < extra) for index in range(count)]


class BatchFeeder:
    def __init__(self, jobs: JobStore, store: BatchApiStore) -> None:
        self.jobs = jobs
        self.store = store
        self._turn = 0

    async def feed(self, lanes: Sequence[HeldLane]) -> None:
        """Move held items of running batches into their lanes, up to each lane's room."""
        waiting = await self.store.held_waiting(lanes) if lanes else []
        by_stream: dict[str, list[HeldLane]] = {}
        for lane, held in zip(lanes, waiting, strict=True):
            if held:
                by_stream.setdefault(lane.stream, []).append(lane)
        if not by_stream:
            return
        lengths = await self.store.lane_lengths(list(by_stream))
        self._turn += 1
        for wanting, length in zip(by_stream.values(), lengths, strict=True):
            room = wanting[0].limit - length
            for lane, share in zip(wanting, shares(room, len(wanting), self._turn), strict=True):
                if share:
                    await self._feed(lane, share)

    async def _feed(self, lane: HeldLane, count: int) -> None:
        """Up to `count` of the lane's held items, CHUNK an ENQUEUE round trip, then each
        chunk's taken ones recorded (`BatchApiStore.fed`); stops where the lane refuses one.
        Counted submitted by the feeder that records them, so once: a second feeder of the same
        items (two producers sweep) finds them enqueued already, and its ENQUEUE takes them
        all the same."""
        while count > 0:
            head = await self.store.held_head(lane, min(count, CHUNK))
            if not head:
                return
            jobs = [lane.job(raw) for raw in head]
            refused = await self.jobs.create_many(jobs, lane.limit)
            taken = refused[0] if refused else len(jobs)
            ids = [job.entry.job_id for job in jobs[:taken]]
            if taken and await self.store.fed(lane, head[0], ids):
                JOBS_SUBMITTED.labels(lane.model, lane.variant, "bulk").inc(taken)
            if taken < len(jobs):
                return
            count -= taken

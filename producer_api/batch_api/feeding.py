"""Feeds a Batch API batch's held items (those its bulk lane had no room for at create) into the
lane as room frees, run by every producer's sweeper: a batch of up to CONVEYOR_MAX_BATCH_LINES
is accepted whatever its lane holds, as OpenAI's is, and the lane never holds more than its
`queue.max_length`, so its backpressure on other submits stays as it is. Each sweep shares a
lane's room among the batches waiting on it, so two big batches both progress, and feeds each
lane on its own: one whose keys Redis refuses waits for the next sweep, the others are fed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from redis.exceptions import RedisError

from shared.batch_api_store import CHUNK, BatchApiStore, HeldLane
from shared.job_store import JobStore
from shared.metrics import JOBS_SUBMITTED

log = logging.getLogger(__name__)

K = TypeVar("K")


def shares(room: int, wants: Sequence[int], turn: int) -> list[int]:
    """`room` split evenly among waiters that hold `wants` items each, none given more than it
    holds: what one leaves goes to those that hold more (split evenly, one share of a batch
    holding fewer items went unused until the next sweep)."""
    given = [0] * len(wants)
    while room > 0 and (short := [i for i, want in enumerate(wants) if given[i] < want]):
        for index, share in zip(short, _even(room, len(short), turn), strict=True):
            taken = min(share, wants[index] - given[index])
            given[index] += taken
            room -= taken
    return given


def _even(room: int, count: int, turn: int) -> list[int]:
    """`room` split among `count` waiters, the remainder to `room % count` of them from
    `turn` on, so a room smaller than the waiters goes round them sweep by sweep."""
    base, extra = divmod(room, count)
    return [base + ((index - turn) % count < extra) for index in range(count)]


async def _each(
    read: Callable[[Sequence[K]], Awaitable[list[int]]],
    keys: Sequence[K],
    name: Callable[[K], str],
) -> list[int | None]:
    """`read` of every key in one round trip or, where Redis refuses it (a key of another type:
    WRONGTYPE; in a cluster, a slot whose master is down), of each key alone, None for one
    refused (logged; the next sweep tries it again): one pipeline for every lane, refused, left
    every lane unfed, every sweep. Every key refused is raised: Redis is out, which the
    sweeper's loop logs once and backs off from."""
    try:
        return list(await read(keys))
    except RedisError:
        alone = await asyncio.gather(*(read([key]) for key in keys), return_exceptions=True)
        if all(isinstance(reply, RedisError) for reply in alone):
            raise
    return [_count(reply, name(key)) for key, reply in zip(keys, alone, strict=True)]


def _count(reply: list[int] | BaseException, name: str) -> int | None:
    """One key's count (`_each`), None where Redis refused it."""
    if isinstance(reply, RedisError):
        log.warning("held items of %s not fed (%r); tried again next sweep", name, reply)
        return None
    if isinstance(reply, BaseException):
        raise reply
    return reply[0]


def _held_list(lane: HeldLane) -> str:
    return lane.held


class BatchFeeder:
    def __init__(self, jobs: JobStore, store: BatchApiStore) -> None:
        self.jobs = jobs
        self.store = store
        self._turn = 0

    async def feed(self, lanes: Sequence[HeldLane]) -> None:
        """Move held items of running batches into their lanes, up to each lane's room."""
        waiting = await _each(self.store.held_waiting, lanes, _held_list) if lanes else []
        by_stream: dict[str, list[tuple[HeldLane, int]]] = {}
        for lane, held in zip(lanes, waiting, strict=True):
            if held:
                by_stream.setdefault(lane.stream, []).append((lane, held))
        if not by_stream:
            return
        lengths = await _each(self.store.lane_lengths, list(by_stream), str)
        self._turn += 1
        for wanting, length in zip(by_stream.values(), lengths, strict=True):
            if length is None:
                continue
            room = wanting[0][0].limit - length
            given = shares(room, [held for _, held in wanting], self._turn)
            for (lane, _), share in zip(wanting, given, strict=True):
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

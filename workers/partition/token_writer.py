"""Appends one loop tick's token events, for every running job at once, in ONE pipelined round
trip, and reads those jobs' statuses back in the same trip: a job cancelled through the API is
seen (and aborted) after the next engine step without any extra Redis call (the loop's status
poll of jobs that yield nothing is the same call with no events). Each job's events go through
APPEND (shared/token_scripts.py), so a trip resent after its reply was lost appends
nothing twice, and a run whose job another worker took over (a reclaim) appends nothing more.
A stream being written lives the result TTL (a long generation keeps its head, and a write that
recreates a lost stream gives it that TTL); the write of its final event cuts that to
CONVEYOR_TOKEN_STREAM_TTL_S: the text lives on in the job's result, and readers of an expired
stream get the final event from the job's hash. A final event says the status the job's hash
ended with where the API ended the job (a cancel) in the step that ended its generation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import redis.asyncio as aioredis

from shared import token_scripts
from shared.codec import as_text
from shared.keys import GROUP, Keys
from shared.redis_client import queue_script, run_pipeline
from shared.token_stream import TokenEvent, ended_stream_ttl_s


@dataclass(frozen=True, slots=True)
class EntryHolder:
    """A consumer that must still hold a job's lane entry (`stream`, `entry_id`) for the run's
    events to be appended: once another worker took the entry over, they are refused."""

    stream: str
    entry_id: bytes
    consumer: str


@dataclass(frozen=True, slots=True)
class TokenAppend:
    """One tick's events of one run (`attempt`) of a job, the first numbered `first` in that
    run; `expire`: set the stream's TTL (its first and last writes: the one with a final event
    sets the shorter, finished stream's); `holder`: who must hold the job's lane entry (None:
    unchecked, a stream written with no lane behind it)."""

    job_id: str
    attempt: str
    first: int
    events: Sequence[TokenEvent]
    expire: bool
    holder: EntryHolder | None = None


@dataclass(frozen=True, slots=True)
class TickWritten:
    """`refused`: the jobs whose events APPEND refused, as another run of theirs wrote their
    streams since (give them up); `statuses`: each watched job's status (None: hash gone), and
    that of each job whose final APPEND wrote with the status the API ended the job with."""

    refused: list[str]
    statuses: dict[str, str | None]


class TokenWriter:
    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        """`ttl_s`: the result TTL, which a stream keeps while written; a finished one keeps
        CONVEYOR_TOKEN_STREAM_TTL_S, never longer."""
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.final_ttl_s = ended_stream_ttl_s(ttl_s)
        self._append = client.register_script(token_scripts.APPEND)

    async def write(self, appends: Sequence[TokenAppend], watch: Sequence[str]) -> TickWritten:
        """Append each job's events in order, and read the status of each job in `watch`."""
        if not appends and not watch:
            return TickWritten([], {})
        _, replies = await run_pipeline(
            self.redis, partial(self._queue, appends, watch), [self._append]
        )
        appended, statuses = replies[: len(appends)], replies[len(appends) :]
        watched = {
            job_id: None if status is None else as_text(status)
            for job_id, status in zip(watch, statuses, strict=True)
        }
        # APPEND's reply to a final it wrote as the API ended the job: the loop ends the run so
        ended: dict[str, str | None] = {
            append.job_id: as_text(reply)
            for append, reply in zip(appends, appended, strict=True)
            if isinstance(reply, bytes | str)
        }
        return TickWritten(
            [append.job_id for append, ok in zip(appends, appended, strict=True) if not ok],
            watched | ended,
        )

    async def _queue(self, appends: Sequence[TokenAppend], watch: Sequence[str], pipe: Any) -> None:
        for append in appends:
            keys = [self.keys.tokens(append.job_id), self.keys.job(append.job_id)]
            args = _head(append, *self._ttl(append))
            if append.holder is not None:
                keys.append(append.holder.stream)
            for event in append.events:
                fields = event.encode()
                args.append(len(fields))
                args.extend(part for pair in fields.items() for part in pair)
            queue_script(pipe, self._append, keys, args)
        for job_id in watch:
            pipe.hget(self.keys.job(job_id), "status")

    async def ended(self, job_ids: Sequence[str]) -> None:
        """Give the streams of jobs that will not run again (ended while a dead worker's run of
        theirs waited to be taken over) a finished stream's TTL, never a longer one: the dead
        run's partial text kept the result TTL, a day by default."""
        if not job_ids:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.expire(self.keys.tokens(job_id), self.final_ttl_s, lt=True)
            await pipe.execute()

    def _ttl(self, append: TokenAppend) -> tuple[int, str]:
        """The TTL `append` sets and APPEND's EXPIRE option for it: the short one of a finished
        stream (its final event is in it), the long one of a stream being written, or that one
        only where the stream has none (NX: the stream's stays)."""
        if not append.expire:
            return self.ttl_s, "NX"
        final = any(event.final for event in append.events)
        return (self.final_ttl_s if final else self.ttl_s), ""


def _head(append: TokenAppend, ttl_s: int, expire_option: str) -> list[Any]:
    """APPEND's arguments before the events: TTL and its EXPIRE option, run, first number, and
    the lane entry's group, id and consumer (empty when unchecked)."""
    holder = append.holder
    held = ("", "", "") if holder is None else (GROUP, holder.entry_id, holder.consumer)
    return [ttl_s, expire_option, append.attempt, append.first, *held]

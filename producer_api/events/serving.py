"""Job events without HTTP. While a job is queued it gets `queued` events (position, ETA) when
they change, at most once a second, and one `scaling` event while no worker serves its
partition (none while its load is not known yet, as a producer starts). Then an LLM job streams
its token stream from where the client left off (every missed chunk once, then live ones, then
one final event); any other job sends a single final event when it ends, woken by the reply
listener rather than by polling. A key holds at most its own `max_streams`, else
CONVEYOR_MAX_STREAMS_PER_KEY, streams open at once (each costs Redis reads and a socket)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial
from typing import Any

import anyio
from redis.exceptions import RedisError

from producer_api.auth.key_watch import REVOKED, KeyWatch
from producer_api.auth.principal import Principal
from producer_api.errors import ConveyorError
from producer_api.events.protocol import JobEvent
from producer_api.jobs.serving import REPLYLESS_POLL_S, JobsService, not_found
from producer_api.live_feed import stop_read, while_holds
from producer_api.state import ProducerState
from producer_api.stream_places import take_place
from producer_api.token_hub import START, TokenFollower
from shared.codec import stream_id
from shared.job_states import JobStatus
from shared.job_store import JobRecord
from shared.token_stream import appended_final_id, final_id, made_final_id

# A stream's place among its key's open streams lapses after this many key checks
# (CONVEYOR_STREAM_RECHECK_S) unrenewed: the place of a stream whose producer died before giving
# it back.
LAPSE_CHECKS = 3
QUEUED_EVERY_S = 1.0
SCALING = (
    "no worker serves this partition: the autoscaler starts one from its queue depth (KEDA"
    " activates from zero replicas on it; `conveyor autoscale` likewise)"
)


def _as_written(entry_id: str) -> str:
    """`entry_id` as Redis writes it. Redis reads `00-1` as `0-1`, but the ids it is compared
    with are text: the final's own id so spelled was not told 204 (the final came again), and
    `00-0` passed for no START, reaching Redis as the range `(00-0` it refuses (a 500)."""
    ms, seq = stream_id(entry_id)
    return f"{ms}-{seq}"


class EventsService:
    def __init__(self, state: ProducerState, principal: Principal) -> None:
        self.state = state
        self.principal = principal
        self.jobs = JobsService(state, principal)

    async def open(self, job_id: str, last_event_id: str | None) -> AsyncIterator[JobEvent] | None:
        """The caller's job's events after `last_event_id`; None when there are none to send
        (`last_event_id` is the final event of a job that ended); raises 404 (before any event
        is sent) when the job is unknown or another tenant's, 422 when `last_event_id` names no
        event of its stream, 429 when the key holds its cap of streams open. A key revoked or
        expired meanwhile ends the stream within CONVEYOR_STREAM_RECHECK_S with an `error` event
        (type `unauthorized`); the job runs on."""
        record = await self.jobs.owned(job_id)
        if last_event_id is not None:
            last_event_id = _as_written(last_event_id)
        config = self.state.repository.get(record.fields.get("model", ""))
        streams = config is not None and config.kind == "generate"
        if last_event_id is not None and not await self._resumes(record, last_event_id, streams):
            return None
        if streams:
            events = self._after_queue(job_id, self._tokens(job_id, last_event_id or START))
        else:
            events = self._after_queue(job_id, self._final(job_id))
        return self._while_key_holds(events, await take_place(self.state, self.principal))

    async def _resumes(self, record: JobRecord, last_event_id: str, streams: bool) -> bool:
        """Whether anything follows `last_event_id`: not the final event of a job that ended.
        An id other than START or an entry of the job's stream is refused (422): one from the
        far future had the stream send nothing until the job's end, another job's skipped this
        one's text up to it. A token stream (`streams`) gone (expired) after its job ended
        cannot tell: its final follows, unless the id is the one its worker's final had, which
        the record keeps (an EventSource reconnects after every final: it was sent the whole
        text again). A job that streams no tokens never had one: its only id is its final's."""
        if record.status.terminal and last_event_id == appended_final_id(record):
            return False
        key = self.state.keys.tokens(record.job_id)
        last = await self.state.tokens.last(key)
        if record.status.terminal and last_event_id == final_id(record, last):
            return False
        if last_event_id == START or await self.state.tokens.holds(key, last_event_id):
            return True
        if streams and last is None and record.status.terminal:
            return True
        if record.status.terminal and await self._made_final(key, last_event_id):
            return False
        message = f"Last-Event-ID {last_event_id}: no event of job {record.job_id}'s stream"
        raise ConveyorError(422, "invalid_request", message)

    async def _made_final(self, key: str, last_event_id: str) -> bool:
        """Whether `last_event_id` is the id of a final made from the ended job while its
        stream ended at the entry before it: its worker's own final may have landed after it
        (a job cancelled while it ran), and an EventSource reconnecting with it was refused."""
        before = await self.state.tokens.last(key, before=last_event_id)
        return last_event_id == made_final_id(before.id if before else None)

    async def _while_key_holds(
        self, events: AsyncGenerator[JobEvent, None], stream_id: str | None
    ) -> AsyncIterator[JobEvent]:
        """`events` while the key holds, renewing the stream's place on each look at the key
        and giving it back at the end (a stream never started keeps it until it lapses)."""
        limits_id, quota = self.principal.limits_id, self.principal.quota
        renew = (
            partial(self.state.open_streams.hold, limits_id, stream_id, quota.max_streams)
            if stream_id and quota
            else None
        )
        watch = KeyWatch(self.state.api_keys, self.principal, renew)
        try:
            # Closed at a yield, `while_holds` closes `events` (once begun; before, the outer
            # one does). Left to the garbage collector, it was finalized while `events` was
            # still closing, and asyncio logged its "already running" failure as an error.
            async with contextlib.aclosing(events):
                held = while_holds(events, watch.holds, self.state.settings.stream_recheck_s)
                async with contextlib.aclosing(held):
                    async for event in held:
                        yield event
            if watch.revoked:
                yield JobEvent("error", {"type": "unauthorized", "message": REVOKED})
        finally:
            if stream_id is not None:
                await self._release(stream_id)

    async def _release(self, stream_id: str) -> None:
        """Give the place back, though the stream is being cancelled (the client went away);
        with Redis not answering, it lapses instead."""
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(RedisError):
                await self.state.open_streams.release(self.principal.limits_id, stream_id)

    async def _after_queue(
        self, job_id: str, then: AsyncGenerator[JobEvent, None]
    ) -> AsyncGenerator[JobEvent, None]:
        """`then`'s events, with the job's standing before the first of them: `then` starts at
        once, so its first event (a token, the final one) is never held up by the ticks. Ended
        first, it stops `then` for sure (else a token follower could follow on, unread); closed
        between events, it closes `then` (left to the garbage collector, a token follower kept
        its listener in the hub)."""
        async with contextlib.aclosing(then):
            first = asyncio.ensure_future(anext(then, None))
            try:
                async for event in self._queued(job_id, first):
                    yield event
                if (head := await first) is None:
                    return
            finally:  # a token follower's `wait_for` could swallow a single cancel (gh-86296),
                # and a repeated one (anyio's, as a client leaves) cut a plain wait short
                await stop_read(first)
            yield head
            async for event in then:
                yield event

    async def _queued(
        self, job_id: str, first: asyncio.Future[JobEvent | None]
    ) -> AsyncIterator[JobEvent]:
        """Until `first` is done: the job's standing when it changed, read once a second while
        it is queued with something to wait for (jobs ahead, or no worker). A job at the head
        of its lane with a worker serving is about to start and gets none that tick; it is
        still watched, for that worker may die before it takes the job (then `scaling`)."""
        last: dict[str, Any] = {}
        scaling = False
        while not first.done():
            view = await self.jobs.get(job_id, 0)
            if view["status"] != JobStatus.QUEUED or "queue_position" not in view:
                return
            now = {"queue_position": view["queue_position"], "eta_ms": view.get("eta_ms")}
            # A load not known yet (none read since the producer started) is no idle partition:
            # its workers may well serve it, and such streams each began with a `scaling`.
            load = self.state.queue_eta.load(view["model"], view["variant"])
            idle = load is not None and load.serving == 0
            if load is not None and idle and not scaling:
                data = {"consumers": 0, "warming": load.warming, "message": SCALING, **now}
                yield JobEvent("scaling", data)
            scaling = idle
            if now != last and (idle or now["queue_position"] > 0):
                yield JobEvent("queued", now)
                last = now
            await asyncio.wait([first], timeout=QUEUED_EVERY_S)

    async def _tokens(self, job_id: str, after: str) -> AsyncGenerator[JobEvent, None]:
        """The job's token stream after `after`; closed, it closes its follower at once. One
        that ends with no final (the job's hash gone: expired, deleted) raises 404, an `error`
        event: ended silently, it looked cut, and its client reconnected to be told so."""
        follower = TokenFollower(self.state.tokens, self.state.job_store, self.state.keys)
        ended = False
        async with contextlib.aclosing(follower.follow(job_id, after)) as events:
            async for event in events:
                ended = event.final
                yield JobEvent(event.kind, event.data(), event.id or None)
        if not ended:
            raise not_found(job_id)

    async def _final(self, job_id: str) -> AsyncGenerator[JobEvent, None]:
        """Long-poll in rounds of `max_wait_s` (keep-alive pings flow meanwhile). Once the
        producer is asked to stop, each round answers at once with the job as it stands: the
        job is then read every `REPLYLESS_POLL_S` (it may still end before the stream is cut),
        not back to back, which read it from Redis as fast as Redis answered."""
        view = await self.jobs.get(job_id, self.state.settings.max_wait_s)
        while not JobStatus(view["status"]).terminal:
            if self.state.draining.asked():
                await asyncio.sleep(REPLYLESS_POLL_S)
            view = await self.jobs.get(job_id, self.state.settings.max_wait_s)
        yield JobEvent("final", view, made_final_id(None))

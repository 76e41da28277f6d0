"""Streams end cleanly, never cut mid-body. When the producer stops (SIGTERM), sse-starlette sets
each open stream's shutdown event and gives it `CONVEYOR_STREAM_SHUTDOWN_GRACE_S` to say goodbye
before cutting it; when Redis stops answering mid-stream (frozen or gone past
`CONVEYOR_REDIS_TIMEOUT_S`), or refuses to read the job's events (a key of another type where its
token stream should be, a script running past its limit), there is nothing more to send for now.
Either way a stream stops following its job at once and sends a last event telling the client to
reconnect: the job keeps running, its token stream lives in Redis, so this producer (once Redis is
back) or another resumes it from Last-Event-ID. A client that stops reading is the one cut mid-body:
once a send has waited SEND_TIMEOUT_S for room (BoundedEventSource), for it to resume likewise."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from redis.exceptions import RedisError
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.types import Receive, Scope, Send

from producer_api.task_cancel import cancel_and_wait
from shared.redis_client import OUT_OF_REACH

log = logging.getLogger(__name__)
T = TypeVar("T")
RECONNECT_MS = 1000
# The longest one send may wait for a client that reads nothing (its window full): without a
# bound a stalled reader held its stream's task and its place in the token hub (which read its
# job for it on) until it closed the socket. A client that reads never waits this long for room.
SEND_TIMEOUT_S = 30.0
RESUME = "reconnect (with Last-Event-ID to resume)"
REFUSED = "the queue's Redis refused to read the job's events ({})"


class BoundedEventSource(EventSourceResponse):
    """sse-starlette's response whose sends wait SEND_TIMEOUT_S at most: a client that stopped
    reading loses its stream as one that closed it would (a job's events resume with
    Last-Event-ID; an OpenAI stream's job is cancelled), quietly, for it is no fault of the
    producer's (raised on, the safety net logged each as a bug)."""

    def __init__(self, content: AsyncIterator[Any], **kwargs: Any) -> None:
        super().__init__(content, send_timeout=SEND_TIMEOUT_S, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            log.info("a stream ends: its client read nothing for %s s", self.send_timeout)


@dataclass(frozen=True, slots=True)
class Cut:
    """A stream ended before its job did, not by the client: `reason` says why, `advice` what a
    job-events client does next (an OpenAI stream takes none: its request, posted again, ran a
    second job while the first ran on)."""

    reason: str
    advice: str = RESUME

    @property
    def message(self) -> str:
        return f"{self.reason}; {self.advice}"


SHUTDOWN = Cut("the producer is shutting down")
UNREACHABLE = Cut("the queue is unreachable")


async def until_shutdown(
    events: AsyncIterator[T], shutdown: anyio.Event, on_end: Callable[[], object] | None = None
) -> AsyncGenerator[T, None]:
    """`events` as they come, until they end (then `on_end` is called) or `shutdown` is set
    (then `events` is closed): a caller tells a stream that ran to its end from one stopped,
    though `shutdown` may be set by then."""
    stop: asyncio.Future[Any] = asyncio.ensure_future(shutdown.wait())
    upcoming: asyncio.Future[Any] = asyncio.ensure_future(anext(events))
    try:
        while True:
            await asyncio.wait({upcoming, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not upcoming.done():
                return
            try:
                item: T = upcoming.result()
            except StopAsyncIteration:
                if on_end is not None:
                    on_end()
                return
            yield item
            upcoming = asyncio.ensure_future(anext(events))
    finally:
        stop.cancel()
        # Cancelled once, a token follower's `wait_for` could swallow it (gh-86296) and follow on.
        await cancel_and_wait(upcoming)
        if (aclose := getattr(events, "aclose", None)) is not None:
            await aclose()


async def until_cut(
    events: AsyncIterator[T], shutdown: anyio.Event
) -> AsyncGenerator[T | Cut, None]:
    """`events` as they come; if the producer shuts down or Redis stops answering before they
    end, one last `Cut` saying which (the caller turns it into its protocol's error event). A
    shutdown that comes once they ran to their end adds none: an error after a complete stream
    made its client retry a job that had succeeded. Closed between items, it closes `events`
    at once (left to the garbage collector, a token follower kept its listener in the hub)."""
    exhausted = asyncio.Event()
    try:
        async with aclosing(until_shutdown(events, shutdown, exhausted.set)) as items:
            async for item in items:
                yield item
    except OUT_OF_REACH as exc:  # a cluster failing over (CLUSTERDOWN) too
        log.info("a stream ends early: redis unavailable (%r)", exc)
        yield UNREACHABLE
        return
    except RedisError as exc:  # a refusal: the key's (WRONGTYPE), a script's (BUSY)
        log.warning("a stream ends early: redis refused a read (%s)", exc)
        yield Cut(REFUSED.format(exc), "reconnect to retry")
        return
    if shutdown.is_set() and not exhausted.is_set():
        yield SHUTDOWN

"""A long-lived stream that must stop once what it was opened under no longer holds: a console
session logged out of, an API key revoked or expired. It is asked again every so often, whether
or not the stream has events to send (a token stream of a queued job sends none until a worker
takes it), so a busy stream costs one look per period, not one per event, and a silent one
still ends on time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from producer_api.task_cancel import cancel_and_wait, uninterrupted

T = TypeVar("T")


async def while_holds(
    events: AsyncGenerator[T, None],
    holds: Callable[[], Awaitable[bool]],
    every_s: float,
    upcoming: asyncio.Future[T] | None = None,
) -> AsyncGenerator[T, None]:
    """`events` as they come, until `holds()`, asked every `every_s`, says no: then the
    stream ends (the pending read cancelled, `events` closed). One read stays pending across
    looks: cancelling it on each would tear down and lose the generator's wait. `upcoming`: a
    read of `events` its caller started already (`anext`), the first one then. A generator, so
    a caller that leaves it early can close it (`aclosing`), `events` with it: once it has
    begun (closed before its first read, it runs nothing, and `events` is its caller's to
    close)."""
    async with aclosing(events):
        try:
            due = time.monotonic() + every_s
            while True:
                upcoming = upcoming or asyncio.ensure_future(anext(events))
                await asyncio.wait({upcoming}, timeout=max(due - time.monotonic(), 0))
                if time.monotonic() >= due:
                    if not await holds():
                        return
                    due = time.monotonic() + every_s
                if not upcoming.done():
                    continue
                try:
                    event = upcoming.result()
                except StopAsyncIteration:
                    return
                upcoming = None
                yield event
        finally:
            await stop_read(upcoming)


async def stop_reading(events: AsyncGenerator[Any, None], read: asyncio.Future[Any]) -> None:
    """End `events` whose read `read` (`anext`) may still be under way: the read first. One
    still running in another read is left to whoever reads it: a `while_holds` whose caller's
    cancel cut its stop short stops that read and closes `events` itself (closing it here
    would raise, "already running")."""
    try:
        await stop_read(read)
    finally:
        if not getattr(events, "ag_running", False):
            await events.aclose()


async def stop_read(read: asyncio.Future[Any] | None) -> None:
    """`cancel_and_wait(read)` seen through though this task is cancelled meanwhile (whoever
    stops it repeats the cancel while a token follower swallows one, gh-86296): cut short, the
    read would run on and closing its generator, still running, would fail. Raised after. One
    done already is waited for too, so its end is retrieved: a read that ended the events
    (StopAsyncIteration) as the stream was cancelled was logged by asyncio as an error."""
    if read is not None:
        await uninterrupted(cancel_and_wait(read))

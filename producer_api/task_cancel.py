"""Stopping a background task for sure. On Python 3.11, `asyncio.wait_for` (which redis-py
wraps around every socket write once a socket timeout is set) can swallow a cancel that lands
just as the write completes (CPython gh-86296). A loop whose cancel was swallowed runs on, and
awaiting it never returns: the producer then hangs in "Waiting for application shutdown", for
instance after it failed to bind its port. So the cancel is repeated until the task ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

RECANCEL_S = 0.1
T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel `task` (again every RECANCEL_S while it runs on) and wait for it to end."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_S)
    if not task.cancelled():
        task.exception()  # retrieved: a loop's last error was logged by the loop itself


async def first_done(
    work: Awaitable[T], rivals: Iterable[asyncio.Future[Any]], timeout: float | None = None
) -> asyncio.Future[T]:
    """`work` as a future once it, or one of `rivals`, is done (or `timeout` has passed): not
    done then, it is cancelled (again while it runs on, as `cancel_and_wait` does: a token
    follower's `wait_for` swallowed a single cancel, and a non-streamed answer held its
    stopping producer for its whole generation) and waited for. The caller reads `cancelled()`
    or `result()`; the rivals stay as they are."""
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    racing: list[asyncio.Future[Any]] = [task, *rivals]
    try:
        await asyncio.wait(racing, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            await cancel_and_wait(task)
    return task


async def uninterrupted(work: Awaitable[T]) -> T:
    """`work` run to its end though this task is cancelled meanwhile, the cancel raised after:
    a clean-up that gives back what a failed submit claimed, cut short by a cancel repeated
    while it waits on a slow Redis (the client-disconnect watch repeats one every RECANCEL_S),
    left the claim standing with nothing behind it. Its own failure is raised first."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            cancelled = True
    result = task.result()
    if cancelled:
        raise asyncio.CancelledError
    return result

"""Stopping a background task for sure. On Python 3.11, `asyncio.wait_for` (which redis-py
wraps around every socket write once a socket timeout is set) can swallow a cancel that lands
just as the write completes (CPython gh-86296). A loop whose cancel was swallowed runs on, and
awaiting it never returns: the producer then hangs in "Waiting for application shutdown", for
instance after it failed to bind its port. So the cancel is repeated until the task ends."""

from __future__ import annotations

import asyncio
from typing import Any

RECANCEL_S = 0.1


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (again every RECANCEL_S while it runs on) and wait for it to end."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_S)
    if not task.cancelled():
        task.exception()  # retrieved: a loop's last error was logged by the loop itself

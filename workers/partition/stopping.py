"""A partition loop's stop, which also cuts short the blocking wait the loop is in (its read of
the lanes, a generate loop's wait for a free slot), so an idle worker stops at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Stopping(asyncio.Event):
    """A loop's stop. Set, it also ends the blocking read in progress under `unless_set` (its
    task cancelled there): an idle worker sat in its read until its block ended, past a shutdown
    grace no longer than CONVEYOR_BLOCK_MS. No task per read: wrapping each read in one (and a
    waiter on the event) cost ~30-60 us per micro-batch on the worker's hot path."""

    def __init__(self) -> None:
        super().__init__()
        self._reading: asyncio.Task[Any] | None = None  # the task inside `unless_set`'s call
        self._cut = False  # whether `set` cancelled it

    def set(self) -> None:
        super().set()
        if self._reading is not None and not self._cut:
            self._cut = True
            self._reading.cancel()

    async def unless_set(self, call: Callable[[], Awaitable[T]]) -> T | None:
        """`call`'s result (a blocking read, which holds nothing yet, or another wait), or None
        once set first: a read's reply, if Redis had sent one, is lost with the cut (the caller
        claims back what it handed over)."""
        task = asyncio.current_task()
        if self.is_set() or task is None:
            return None if self.is_set() else await call()
        self._reading, self._cut = task, False
        try:
            return await call()
        except asyncio.CancelledError:
            if not self._cut or task.uncancel() > 0:
                raise  # not the stop's, or this task is being cancelled besides
            return None
        finally:
            self._reading = None

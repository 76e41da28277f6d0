"""Stop waiting when the client goes away (vLLM's server does the same for non-streamed
requests): a wait still running after WATCH_AFTER_S gets a listener for the ASGI
`http.disconnect` message, which cancels the wait if the client leaves first. The wait runs in
the request's own task, and nothing listens before then: a listener task and a task for the
wait, raced from the start, cost every predict some 60 µs, a tenth of the producer's time per
job, for answers that mostly come within milliseconds."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from producer_api.task_cancel import RECANCEL_S

T = TypeVar("T")
WATCH_AFTER_S = 0.5
CLIENT_CLOSED_REQUEST = 499  # nginx's code for it; nobody reads it, but logs and metrics do


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result; raises ClientDisconnected (with `work` cancelled) if the client
    disconnects first."""
    task = asyncio.current_task()
    assert task is not None  # a request's handler runs in a task
    watch = _Watch(request, task)
    handle = asyncio.get_running_loop().call_later(WATCH_AFTER_S, watch.start)
    try:
        return await work
    except asyncio.CancelledError:
        if watch.taken_back():
            raise ClientDisconnected from None
        raise
    finally:
        handle.cancel()
        await watch.stop()


class _Watch:
    """The listener of one request's wait, once it has waited WATCH_AFTER_S."""

    def __init__(self, request: Request, task: asyncio.Task[Any]) -> None:
        self.request = request
        self.task = task
        self.listener: asyncio.Task[None] | None = None
        self.cancels = 0  # of `task`, for the client's leaving

    def start(self) -> None:
        self.listener = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        """Once the client is gone, cancel the wait, again every RECANCEL_S while it runs on
        (redis-py's `wait_for` can swallow a single cancel: producer_api/task_cancel.py)."""
        await _disconnect(self.request)
        while True:
            self.cancels += 1
            self.task.cancel()
            await asyncio.sleep(RECANCEL_S)

    def taken_back(self) -> bool:
        """Whether the client's leaving alone cancelled the wait: its cancels are taken back
        then, and the request answers on; another's (a stopping server's) stands."""
        remaining = self.task.cancelling()
        for _ in range(self.cancels):
            remaining = self.task.uncancel()
        return self.cancels > 0 and remaining == 0

    async def stop(self) -> None:
        """End the listener, if it started: cancelled before any await, so it cancels the
        request's task no more."""
        if self.listener is not None:
            self.listener.cancel()
            await asyncio.gather(self.listener, return_exceptions=True)


async def _disconnect(request: Request) -> None:
    """Returns once the server reports the client gone (the body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass

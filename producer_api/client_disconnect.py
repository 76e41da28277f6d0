"""Stop waiting when the client goes away (vLLM's server does the same for non-streamed
requests): the wait runs beside a listener for the ASGI `http.disconnect` message, and whichever
ends first cancels the other."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from producer_api.task_cancel import first_done

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result; raises ClientDisconnected (with `work` cancelled) if the client
    disconnects first."""
    listener = asyncio.ensure_future(_disconnect(request))
    try:
        task = await first_done(work, [listener])
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected
    return task.result()


async def _disconnect(request: Request) -> None:
    """Returns once the server reports the client gone (the body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass

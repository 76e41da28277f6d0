"""Streams end cleanly when the producer stops: on SIGTERM, sse-starlette sets each open
stream's shutdown event and gives it `GRACE_S` to say goodbye before cutting it. A stream stops
following its job at once and sends a last event telling the client to reconnect (the job keeps
running; its token stream lives in Redis, so another producer resumes it from Last-Event-ID)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any, TypeVar

import anyio

T = TypeVar("T")
# Shorter than any orchestrator's kill timeout (Kubernetes: 30 s) and uvicorn's graceful one.
GRACE_S = 3.0
RECONNECT_MS = 1000
MESSAGE = "the producer is shutting down; reconnect (with Last-Event-ID to resume)"


async def until_shutdown(events: AsyncIterator[T], shutdown: anyio.Event) -> AsyncIterator[T]:
    """`events` as they come, until they end or `shutdown` is set (then `events` is closed)."""
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
                return
            yield item
            upcoming = asyncio.ensure_future(anext(events))
    finally:
        stop.cancel()
        upcoming.cancel()
        with suppress(asyncio.CancelledError, StopAsyncIteration):
            await upcoming
        if (aclose := getattr(events, "aclose", None)) is not None:
            await aclose()

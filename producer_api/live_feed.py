"""A long-lived stream that must stop once what it was opened under no longer holds: a console
session logged out of, an API key revoked or expired. It is asked again every so often, as the
stream's own events come (a stream with nothing to send is not asked), so a busy stream costs
one look per period, not one per event."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeVar

T = TypeVar("T")


async def while_holds(
    events: AsyncGenerator[T, None], holds: Callable[[], Awaitable[bool]], every_s: float
) -> AsyncIterator[T]:
    """`events` as they come, until `holds()`, asked every `every_s`, says no: then the
    stream ends (`events` closed)."""
    async with aclosing(events):
        due = time.monotonic() + every_s
        async for event in events:
            if time.monotonic() >= due:
                if not await holds():
                    return
                due = time.monotonic() + every_s
            yield event

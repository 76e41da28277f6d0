"""An event stream's resumes honour the server's Retry-After within `reconnect_for_s`: a 503 or
429 asking for an hour (a maintenance page, a proxy's) was slept out whole, silently, by a
stream that promised StreamError once its resumes failed for `reconnect_for_s` seconds."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from conveyor.client import AsyncClient, StreamError, Unavailable, calls
from conveyor.client.sse import EventStream
from tests.local_http import LocalServer, QuietHandler, serving

HOUR = "3600"


class _ClosedServer(LocalServer):
    """Counts the streams asked for: a resume after a pause is a second one."""

    def __init__(self) -> None:
        super().__init__(_Closed)
        self.asked = 0


class _Closed(QuietHandler):
    """Every stream refused: 503, come back in an hour."""

    protocol_version = "HTTP/1.1"
    server: _ClosedServer

    def do_GET(self) -> None:
        self.server.asked += 1
        body = b'{"error": {"type": "unavailable", "message": "down for maintenance"}}'
        headers = {"Content-Type": "application/json", "Retry-After": HOUR}
        self.answer(503, body, headers)


@pytest.fixture
def closed() -> Iterator[_ClosedServer]:
    with serving(_ClosedServer()) as server:
        yield server


async def test_a_retry_after_past_reconnect_for_s_ends_the_stream(closed: _ClosedServer) -> None:
    async def read() -> None:
        async with AsyncClient(closed.url) as client:
            async for _ in client.stream("j", reconnect_for_s=5):
                pass

    with pytest.raises(StreamError, match="Retry-After") as ended:
        await asyncio.wait_for(read(), 60)  # before: asleep for the hour asked
    # ended at the first refusal: no pause of any length (up to reconnect_for_s) and resume
    assert closed.asked == 1
    assert isinstance(ended.value.__cause__, Unavailable)


def test_a_retry_after_within_reconnect_for_s_is_waited_out() -> None:
    """The blocking client shares the decision: a Retry-After that fits is the pause (never
    less), one that does not is StreamError at once, not a pause."""
    headers = httpx.Headers({"Retry-After": "2"})
    stream = EventStream(calls.events_call("j", None), reconnect_for_s=5)
    assert stream.refused(Unavailable(503, "unavailable", "busy", headers)) >= 2
    late = Unavailable(503, "unavailable", "busy", httpx.Headers({"Retry-After": "6"}))
    with pytest.raises(StreamError, match="Retry-After"):
        stream.refused(late)


def test_a_servers_retry_is_waited_out_no_longer_than_reconnect_for_s() -> None:
    """`retry: 99999999` (ms: a day and more) was every pause after it, a clean end's and a
    drop's alike: the stream slept for days, silently, past the budget it promised."""
    stream = EventStream(calls.events_call("j", None), reconnect_for_s=5)
    for line in ("retry: 99999999", "data: {}", ""):
        stream.feed(line)
    assert stream.closed() == 5
    assert stream.dropped(httpx.ConnectError("refused")) == 5
    stream.feed("retry: 2000")  # one within it is honoured whole
    assert stream.closed() == 2

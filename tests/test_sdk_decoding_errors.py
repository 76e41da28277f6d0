"""An answer whose body cannot be decoded (a server's, or a proxy's, broken gzip) is the SDK's
`APIConnectionError`, httpx's `DecodingError` its `__cause__`: it escaped as httpx's own error,
which no `except ConveyorError` caught. A stream whose text cannot be decoded is a dropped
connection: resumed, then `StreamError` once its `reconnect_for_s` ran out."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from conveyor.client import APIConnectionError, AsyncClient, Client, RetryPolicy, StreamError
from tests.local_http import LocalServer, QuietHandler, serving

ONCE = RetryPolicy(max_retries=1, base_s=0.0)


class _BrokenGzip(QuietHandler):
    """Says its body is gzip, and it is not; counts the requests."""

    protocol_version = "HTTP/1.1"
    tries = 0

    def do_GET(self) -> None:
        type(self).tries += 1
        kind = "text/event-stream" if self.path.endswith("/events") else "application/json"
        self.answer(200, b"not gzip at all", {"Content-Type": kind, "Content-Encoding": "gzip"})


@pytest.fixture(scope="module")
def served() -> Iterator[LocalServer]:
    with serving(LocalServer(_BrokenGzip)) as server:
        yield server


@pytest.fixture
def broken(served: LocalServer) -> LocalServer:
    _BrokenGzip.tries = 0
    return served


def _is_decoding_failure(error: BaseException) -> None:
    assert type(error) is APIConnectionError, repr(error)
    assert isinstance(error.__cause__, httpx.DecodingError)
    assert str(error).startswith("cannot decode the producer's answer: DecodingError(")


def test_a_broken_gzip_answer_is_an_api_connection_error(broken: LocalServer) -> None:
    """A GET is resent (its answer may come whole next time), then raised as the SDK's."""
    with Client(broken.url, retry=ONCE) as client, pytest.raises(APIConnectionError) as raised:
        client.get("j")
    _is_decoding_failure(raised.value)
    assert _BrokenGzip.tries == 2


def test_the_async_client_raises_the_same(broken: LocalServer) -> None:
    async def get() -> None:
        async with AsyncClient(broken.url, retry=ONCE) as client:
            await client.get("j")

    with pytest.raises(APIConnectionError) as raised:
        asyncio.run(get())
    _is_decoding_failure(raised.value)


def test_an_undecodable_event_stream_is_resumed_then_lost(broken: LocalServer) -> None:
    with Client(broken.url) as client, pytest.raises(StreamError) as lost:
        list(client.stream("j", reconnect_for_s=0))
    assert "DecodingError" in str(lost.value)
    assert _BrokenGzip.tries == 2  # resumed once: a drop, not the end

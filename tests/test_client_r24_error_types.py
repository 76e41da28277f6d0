"""What the SDK's errors carry for what stands between it and a producer: a proxy's 502 or 504
(retried as an outage) is `Unavailable`, as a 503 is, and an error chunk that ends a streamed
chat completion carries the stream's X-Request-ID. A real HTTP server answers every request
with one scripted answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from conveyor.client import (
    APIError,
    AsyncClient,
    Client,
    RetryPolicy,
    StreamFailed,
    Unavailable,
)
from tests.local_http import LocalServer, QuietHandler, serving

GATEWAY_PAGE = b"<html><body><h1>502 Bad Gateway</h1>nginx</body></html>"
PRODUCERS_502 = b'{"error": {"type": "invalid_output", "message": "not a list"}}'
ERROR_CHUNK = b'data: {"error": {"type": "failed", "message": "the worker died"}}\n\n'
STREAM = {"Content-Type": "text/event-stream", "X-Request-ID": "job-7"}
Answer = tuple[int, dict[str, str], bytes]


class _OneAnswer(LocalServer):
    """Answers every request with `reply`."""

    def __init__(self, reply: Answer) -> None:
        super().__init__(_Handler)
        self.reply = reply


class _Handler(QuietHandler):
    protocol_version = "HTTP/1.1"
    server: _OneAnswer

    def do_GET(self) -> None:
        status, headers, body = self.server.reply
        self.answer(status, body, headers)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.do_GET()


@pytest.fixture
def answering(request: pytest.FixtureRequest) -> Iterator[_OneAnswer]:
    with serving(_OneAnswer(request.param)) as running:
        yield running


@pytest.mark.parametrize(
    "answering",
    [(502, {"Content-Type": "text/html"}, GATEWAY_PAGE), (504, {}, b"gateway timeout")],
    indirect=True,
)
def test_a_proxys_gateway_error_is_unavailable(answering: _OneAnswer) -> None:
    """Retried as a 503 is, and raised as one once the retries run out: it was a bare APIError,
    which `except Unavailable` let through."""
    no_retries = RetryPolicy(max_retries=0)
    with Client(answering.url, retry=no_retries) as client, pytest.raises(Unavailable) as raised:
        client.get("job-1")
    assert raised.value.status == answering.reply[0]


@pytest.mark.parametrize(
    "answering",
    [(502, {"Content-Type": "application/json"}, PRODUCERS_502)],
    indirect=True,
)
def test_the_producers_own_502_is_no_outage(answering: _OneAnswer) -> None:
    """The producer's own 502 (an engine's output of the wrong shape, its body the producer's
    error) is no gateway's: an APIError of its type, not Unavailable."""
    no_retries = RetryPolicy(max_retries=0)
    with Client(answering.url, retry=no_retries) as client, pytest.raises(APIError) as raised:
        client.get("job-1")
    assert not isinstance(raised.value, Unavailable)
    assert (raised.value.status, raised.value.type) == (502, "invalid_output")


@pytest.mark.parametrize("answering", [(200, STREAM, ERROR_CHUNK)], indirect=True)
def test_a_chat_streams_error_chunk_carries_its_request_id(answering: _OneAnswer) -> None:
    """The id to quote to the operator (the completion's job) was None: the error chunk's
    StreamFailed was made without the response's headers."""
    with Client(answering.url) as client, pytest.raises(StreamFailed) as raised:
        list(client.chat_stream("m", [{"role": "user", "content": "hi"}]))
    assert (raised.value.type, raised.value.request_id) == ("failed", "job-7")


@pytest.mark.parametrize("answering", [(200, STREAM, ERROR_CHUNK)], indirect=True)
def test_async_chat_streams_error_chunk_carries_its_request_id(answering: _OneAnswer) -> None:
    async def streamed() -> None:
        async with AsyncClient(answering.url) as client:
            async for _ in client.chat_stream("m", [{"role": "user", "content": "hi"}]):
                pass

    with pytest.raises(StreamFailed) as raised:
        asyncio.run(streamed())
    assert raised.value.request_id == "job-7"

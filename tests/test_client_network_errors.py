"""What the SDK raises when the network, not the producer, fails: a connection refused, an
answer that never comes, a connection closed unanswered are `APIConnectionError` (a timeout
`APITimeoutError`), with httpx's error as `__cause__`: they were httpx's own errors, which an
`except ConveyorError` missed. And how long a call may retry in all (`max_total_s`)."""

from __future__ import annotations

import asyncio
import time
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from conveyor.client import (
    APIConnectionError,
    APITimeoutError,
    AsyncClient,
    Client,
    ConveyorError,
    RateLimited,
    RetryPolicy,
)
from conveyor.stack import free_port
from tests.local_http import LocalServer, serving

ONCE = RetryPolicy(max_retries=1, base_s=0.0)


class _Silent(BaseHTTPRequestHandler):
    """Reads the request and answers nothing for longer than the client waits."""

    def do_GET(self) -> None:
        time.sleep(2)


class _HangsUp(BaseHTTPRequestHandler):
    """Reads the request and closes the connection unanswered."""

    def do_GET(self) -> None:
        self.close_connection = True


class _Busy(BaseHTTPRequestHandler):
    """Always 429, asking to come back in 2 s; counts the requests."""

    tries = 0

    def do_GET(self) -> None:
        type(self).tries += 1
        body = b'{"error": {"type": "rate_limited", "message": "busy"}}'
        self.send_response(429)
        self.send_header("Retry-After", "2")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def _raised(url: str, timeout: float = 30.0) -> ConveyorError:
    with Client(url, timeout=timeout, retry=ONCE) as client, pytest.raises(ConveyorError) as raised:
        client.get("j")
    return raised.value


def test_a_producer_not_listening_is_an_api_connection_error() -> None:
    error = _raised(f"http://127.0.0.1:{free_port()}")
    assert type(error) is APIConnectionError and isinstance(error.__cause__, httpx.ConnectError)
    assert str(error).startswith("cannot reach the producer: ConnectError(")  # the CLI's line


def test_an_answer_that_never_comes_is_an_api_timeout_error() -> None:
    with serving(LocalServer(_Silent)) as server:
        error = _raised(server.url, timeout=0.2)
    assert type(error) is APITimeoutError and isinstance(error.__cause__, httpx.ReadTimeout)


def test_a_connection_closed_unanswered_is_an_api_connection_error() -> None:
    with serving(LocalServer(_HangsUp)) as server:
        error = _raised(server.url)
    assert type(error) is APIConnectionError
    assert isinstance(error.__cause__, httpx.RemoteProtocolError)


def test_the_async_client_raises_the_same() -> None:
    async def get() -> None:
        async with AsyncClient(f"http://127.0.0.1:{free_port()}", retry=ONCE) as client:
            await client.get("j")

    with pytest.raises(APIConnectionError) as raised:
        asyncio.run(get())
    assert isinstance(raised.value.__cause__, httpx.ConnectError)


def test_retries_end_within_the_policys_total() -> None:
    """Five Retry-Afters of up to 300 s were each honoured: a call with no timeout of its own
    retried for 25 minutes. A retry that would start past `max_total_s` is not made."""
    policy = RetryPolicy(max_retries=5, max_total_s=3.0)
    _Busy.tries = 0
    with (
        serving(LocalServer(_Busy)) as server,
        Client(server.url, retry=policy) as client,
        pytest.raises(RateLimited),
    ):
        client.get("j")
    assert _Busy.tries == 2  # the first retry starts 2 s in; a second would start past 3 s

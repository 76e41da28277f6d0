"""A receiver that answers a large body early (a 413) and closes without reading it, a real
HTTP server on a socket: the HTTP client's asyncio stream reads only while a read waits, and the
failed write closes it with the answer unread, so the attempt is a network error (retried for
the window, then `failed`, as README says) whose record read "ReadError: ". It says now what
happened and what the receiver must do."""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from shared.settings import get_settings
from workers import webhook_delivery

# Past what the sockets' buffers take (a send buffer of up to 4 MB by default, a receive
# buffer that grows only as it is read): the write is still going when the receiver closes.
# A body of 100 KB is taken whole, and its 413 read.
LARGE_BODY = b"x" * 32_000_000


class _RefusesEarly(socketserver.BaseRequestHandler):
    """Reads the request's head, answers 413 and closes, the body unread."""

    def handle(self) -> None:
        head = b""
        while b"\r\n\r\n" not in head and (chunk := self.request.recv(4096)):
            head += chunk
        self.request.sendall(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n")


@pytest.fixture(scope="module")
def refusing_receiver() -> Iterator[str]:
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _RefusesEarly) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
        server.shutdown()


def test_a_413_answered_before_a_large_body_is_recorded_as_what_it_is(
    refusing_receiver: str, settings_env: Callable[..., None]
) -> None:
    settings_env(CONVEYOR_WEBHOOK_SECRET="whsec-test")
    attempt = webhook_delivery._post(refusing_receiver, LARGE_BODY, {"id": "e1"})
    assert attempt["error"].startswith("ReadError: connection closed before an answer was read")
    assert "must read or drain the body" in attempt["error"]
    status, _ = webhook_delivery.after_attempt(1, attempt, time.time(), get_settings())
    assert status == "retrying"  # a network error: `failed` once past the retry window


def test_a_413_to_a_small_body_fails_at_once(
    refusing_receiver: str, settings_env: Callable[..., None]
) -> None:
    settings_env(CONVEYOR_WEBHOOK_SECRET="whsec-test")
    attempt = webhook_delivery._post(refusing_receiver, b"{}", {"id": "e1"})
    assert (attempt["status_code"], attempt["error"]) == (413, "HTTP 413")
    assert webhook_delivery.after_attempt(1, attempt, time.time(), get_settings())[0] == "failed"

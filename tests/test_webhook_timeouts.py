"""One webhook attempt against receivers at their worst, on real local sockets: a receiver
that trickles its answer a byte at a time (httpx's timeout bounds each read, so such a receiver
held the worker's one task loop, every other delivery and the worker's exit behind it for as
long as it liked), and a URL the allow-list matched but no HTTP client can send to."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from shared.webhook_events import allowed
from workers.webhook_delivery import _post

EVENT = {"id": "evt_1", "type": "job.succeeded"}


@pytest.fixture
def trickling() -> Iterator[str]:
    """A receiver that answers its status line, then one header byte every 0.2 s for 6 s."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            for _ in range(30):
                time.sleep(0.2)
                try:
                    connection.sendall(b"z")
                except OSError:
                    return  # the client gave up
            connection.sendall(b"\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/hooks/slow"
    listener.close()


@pytest.fixture
def one_second(settings_env: Callable[..., None]) -> None:
    settings_env(CONVEYOR_WEBHOOK_TIMEOUT_S="1", CONVEYOR_WEBHOOK_SECRET="whsec-test")


def test_an_answer_trickled_a_byte_at_a_time_times_out_as_a_whole(
    trickling: str, one_second: None
) -> None:
    outcome = _post(trickling, b"{}", EVENT)
    assert outcome["status_code"] is None
    assert outcome["error"] == "TimeoutError: no answer within 1s", outcome


def test_a_host_no_idna_encoding_takes_is_not_allowed() -> None:
    """They matched a `*.` rule and were accepted at submit; the delivery then raised out of
    the task (InvalidURL is no HTTPError), with no attempt on record and no retry."""
    rules = ["https://*.acme.io"]
    assert allowed("https://hooks.acme.io/", rules)
    for url in ("https://\u0661.acme.io/", "https://\u200b.acme.io/"):
        assert not allowed(url, rules), url
        assert _post(url, b"{}", EVENT)["error"].startswith("InvalidURL"), url

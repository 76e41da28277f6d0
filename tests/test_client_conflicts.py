"""The SDK against a real HTTP server that answers a submit with 409 first: a 409 that carries
`Retry-After` (the producer's answer to an idempotent retry whose first try is still being
enqueued) is tried again with the same Idempotency-Key; a 409 without it (the key was used with
another body) is the caller's to handle, at once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from conveyor.client import Client, RetryEvent
from conveyor.client.errors import APIError

JOB = {"id": "job-1", "status": "queued", "model": "identity", "variant": "default"}


class ConflictServer(ThreadingHTTPServer):
    """Answers each POST with the next of `answers` (status, Retry-After or None), recording the
    Idempotency-Key each one came with."""

    def __init__(self, answers: list[tuple[int, str | None]]) -> None:
        super().__init__(("127.0.0.1", 0), _ConflictHandler)
        self.answers = answers
        self.keys: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ConflictHandler(BaseHTTPRequestHandler):
    server: ConflictServer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.keys.append(self.headers.get("Idempotency-Key"))
        status, retry_after = self.server.answers[len(self.server.keys) - 1]
        error = {"type": "conflict", "message": "still being enqueued; retry"}
        body = json.dumps(JOB if status == 202 else {"error": error}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def serving() -> Iterator[list[ConflictServer]]:
    """Servers the test starts, shut down after it."""
    servers: list[ConflictServer] = []
    yield servers
    for server in servers:
        server.shutdown()


def _started(servers: list[ConflictServer], answers: list[tuple[int, str | None]]) -> str:
    server = ConflictServer(answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    servers.append(server)
    return server.url


def test_a_409_with_retry_after_is_tried_again_with_the_same_key(
    serving: list[ConflictServer],
) -> None:
    url = _started(serving, [(409, "0"), (202, None)])
    retries: list[RetryEvent] = []
    with Client(url, on_retry=retries.append) as client:
        job = client.submit("identity", {"x": 1})
    assert job.id == "job-1" and [r.reason for r in retries] == ["HTTP 409"]
    first, again = serving[0].keys
    assert first is not None and first == again  # the retry is the same submit


def test_a_409_without_retry_after_is_raised_at_once(serving: list[ConflictServer]) -> None:
    url = _started(serving, [(409, None), (202, None)])
    retries: list[RetryEvent] = []
    with Client(url, on_retry=retries.append) as client, pytest.raises(APIError) as conflict:
        client.submit("identity", {"x": 1})
    assert conflict.value.status == 409 and retries == [] and len(serving[0].keys) == 1

"""The SDK's retries against the real pipeline through a proxy that loses an answer: the
producer took the request and made the job, the client never heard. A predict sent again with
its Idempotency-Key is answered with that job, not a second one; `/predict`, keyless, raised
the lost connection instead."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from conveyor.client import Client, RetryPolicy
from tests.local_http import LocalServer, serving

pytestmark = pytest.mark.slow


class _LossyProxy(LocalServer):
    """Forwards each request to the producer at `upstream`; the answer to the first POST is
    dropped (the connection closed unanswered) after the producer gave it."""

    def __init__(self, upstream: str) -> None:
        super().__init__(_Handler)
        self.upstream = httpx.Client(base_url=upstream, timeout=120)
        self.posted: list[dict[str, Any]] = []  # the producer's answers to the POSTs


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _LossyProxy

    def do_GET(self) -> None:
        self._forward(None)

    def do_POST(self) -> None:
        self._forward(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def _forward(self, body: bytes | None) -> None:
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() in ("content-type", "idempotency-key", "authorization")
        }
        answer = self.server.upstream.request(
            self.command, self.path, content=body, headers=headers
        )
        if body is not None:
            self.server.posted.append(answer.json())
            if len(self.server.posted) == 1:
                self.close_connection = True  # the answer is lost on its way back
                return
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def proxy(base_url: str) -> Iterator[_LossyProxy]:
    with serving(_LossyProxy(base_url)) as running:
        yield running
        running.upstream.close()


def test_a_predict_whose_answer_was_lost_gets_the_job_it_made(
    proxy: _LossyProxy, identity_worker: int
) -> None:
    with Client(proxy.url, retry=RetryPolicy(base_s=0.0)) as client:
        job = client.predict("identity", {"lost": 1}, timeout=30)
    first, again = proxy.posted
    assert job.succeeded and job.outputs == {"lost": 1}
    assert first["id"] == again["id"] == job.id  # one job, not two

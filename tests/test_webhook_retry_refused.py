"""A webhook whose next attempt the broker refused to queue: Celery's retry turned the refused
publish into Reject(requeue=False), so the delivery was dropped, its owed entry long cleared at
hand-over: never sent again, its status `retrying` for good, though deliveries are retried
until CONVEYOR_WEBHOOK_RETRY_FOR_S. Here a real Celery worker on a Valkey of the module's own,
which refuses writes (maxmemory, noeviction: LPUSH refused, HDEL allowed) from the first POST
until 2 s later."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis

from conveyor.stack import Stack
from shared.webhook_events import WebhookDispatcher, event
from tests.conftest import until

pytestmark = pytest.mark.slow
REFUSED_FOR_S = 2.0


class _RefusingReceiver(ThreadingHTTPServer):
    """Answers its first POST 503 (Retry-After: 1), having made the broker refuse writes for
    REFUSED_FOR_S; every later one 200. Counts the POSTs."""

    def __init__(self, broker: redis.Redis) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.broker = broker
        self.posts = 0

    def refuse_writes(self) -> None:
        self.broker.config_set("maxmemory-policy", "noeviction")
        self.broker.config_set("maxmemory", 1)
        threading.Timer(REFUSED_FOR_S, self.broker.config_set, ("maxmemory", 0)).start()


class _Handler(BaseHTTPRequestHandler):
    server: _RefusingReceiver

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts += 1
        first = self.server.posts == 1
        if first:
            self.server.refuse_writes()
        self.send_response(503 if first else 200)
        if first:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A Valkey of the module's own (its writes are refused) and nothing else yet."""
    own = Stack.create(tmp_path_factory.mktemp("webhook-refused"))
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="module")
def receiver(stack: Stack) -> Iterator[_RefusingReceiver]:
    broker = stack.client()
    server = _RefusingReceiver(broker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        broker.config_set("maxmemory", 0)
        broker.close()


def test_a_retry_the_broker_refused_to_queue_is_still_made(
    stack: Stack, receiver: _RefusingReceiver
) -> None:
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hooks/refused"
    stack.start_worker(
        "identity:default",
        CONVEYOR_WEBHOOK_SECRET="whsec-refused",
        CONVEYOR_WEBHOOK_ALLOWLIST=url,
    )
    body = event("job.succeeded", "default", {"id": "j-refused"}, "j-refused_succeeded")
    WebhookDispatcher(stack.redis_url).send("job", "j-refused", url, body)
    until(lambda: receiver.posts >= 2, timeout=30)

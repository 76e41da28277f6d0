"""A webhook whose next attempt the broker refused to queue: Celery's retry turned the refused
publish into Reject(requeue=False), so the delivery was dropped, its owed entry long cleared at
hand-over: never sent again, its status `retrying` for good, though deliveries are retried
until CONVEYOR_WEBHOOK_RETRY_FOR_S. Here a real Celery worker on a Valkey of the module's own,
which refuses writes (maxmemory, noeviction: LPUSH refused, HDEL allowed) from the first POST
until 2 s later; and a worker asked to stop while it waits for the broker to take its retry.
"""

from __future__ import annotations

import contextlib
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
    `refused_for_s` (None: until the test ends); every later one 200. Counts the POSTs."""

    def __init__(self, broker: redis.Redis, refused_for_s: float | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.broker = broker
        self.refused_for_s = refused_for_s
        self.posts = 0

    def refuse_writes(self) -> None:
        self.broker.config_set("maxmemory-policy", "noeviction")
        self.broker.config_set("maxmemory", 1)
        if self.refused_for_s is not None:
            lift = threading.Timer(self.refused_for_s, self.broker.config_set, ("maxmemory", 0))
            lift.start()


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


@contextlib.contextmanager
def _receiving(stack: Stack, refused_for_s: float | None) -> Iterator[_RefusingReceiver]:
    broker = stack.client()
    server = _RefusingReceiver(broker, refused_for_s)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        broker.config_set("maxmemory", 0)
        broker.close()


def _url(receiver: _RefusingReceiver) -> str:
    return f"http://127.0.0.1:{receiver.server_address[1]}/hooks/refused"


def _spawn_worker(stack: Stack, receiver: _RefusingReceiver) -> str:
    """A worker that may deliver to `receiver`, started; its name, for `wait_ready`."""
    return stack.spawn_worker(
        "identity:default",
        CONVEYOR_WEBHOOK_SECRET="whsec-refused",
        CONVEYOR_WEBHOOK_ALLOWLIST=_url(receiver),
        CONVEYOR_SHUTDOWN_GRACE_S="1",
    )


def _send_webhook(stack: Stack, receiver: _RefusingReceiver) -> None:
    body = event("job.succeeded", "default", {"id": "j-refused"}, "j-refused_succeeded")
    WebhookDispatcher(stack.redis_url).send("job", "j-refused", _url(receiver), body)


def _refused_webhook(stack: Stack, receiver: _RefusingReceiver) -> None:
    """A worker, and a webhook for it to deliver to `receiver`."""
    stack.wait_ready(_spawn_worker(stack, receiver))
    _send_webhook(stack, receiver)


def test_a_retry_the_broker_refused_to_queue_is_still_made(bare_stack: Stack) -> None:
    with _receiving(bare_stack, REFUSED_FOR_S) as receiver:
        _refused_webhook(bare_stack, receiver)
        until(lambda: receiver.posts >= 2, timeout=30)


def test_a_worker_waiting_to_queue_a_retry_stops_when_asked(bare_stack: Stack) -> None:
    """The wait for the broker ran on the solo pool's main thread, which looks at the stop
    flags only between tasks: a SIGTERM went unheeded (the worker's engine still taking work)
    until the worker was killed, a micro-batch perhaps in hand. On a pool thread it ends too,
    the delivery left unacknowledged."""
    with (
        _receiving(bare_stack, None) as receiver,
        contextlib.closing(bare_stack.client()) as broker,
    ):
        _refused_webhook(bare_stack, receiver)
        log = bare_stack.log_path("identity-default")
        until(lambda: "next attempt not queued" in log.read_text(errors="replace"), timeout=30)
        code = bare_stack.stop_process("identity-default", timeout=20)
        # not acknowledged: kombu still holds it (its restore to the queue refused, as writes are)
        assert broker.hlen("unacked") + broker.llen("celery") == 1
    assert code == 0, bare_stack.log_tail("identity-default")

"""A real local HTTP receiver for webhook tests: answers each path with its scripted statuses in
turn (then 200) and records every delivery; and the webhook task run as a worker runs it,
against such receivers, its bookkeeping on a test's Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis

from shared.keys import Keys
from workers import webhook_delivery
from workers.webhook_delivery import AttemptLog, ReceiverHolds


class Receiver(ThreadingHTTPServer):
    def __init__(self, script: dict[str, list[int]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.deliveries: list[dict[str, Any]] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def at(self, path: str) -> list[dict[str, Any]]:
        return [d for d in self.deliveries if d["path"] == path]


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        statuses = self.server.script.get(self.path, [])
        status = statuses.pop(0) if statuses else 200
        self.server.deliveries.append(
            {"path": self.path, "at": time.monotonic(), "headers": dict(self.headers),
             "body": body, "status": status}
        )  # fmt: skip
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@contextmanager
def serving(script: dict[str, list[int]] | None = None) -> Iterator[Receiver]:
    server = Receiver(script or {})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()


def delivering_to(
    origin: str,
    prefix: str,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> Keys:
    """Deliveries allowed to `origin`, their bookkeeping on `redis_client` under `prefix`."""
    settings_env(
        CONVEYOR_WEBHOOK_SECRET="whsec-test",
        CONVEYOR_WEBHOOK_ALLOWLIST=origin,
        CONVEYOR_KEY_PREFIX=prefix,
    )
    keys = Keys(prefix)
    monkeypatch.setattr(webhook_delivery, "_redis", lambda: redis_client)
    monkeypatch.setattr(webhook_delivery, "_attempt_log", lambda: AttemptLog(redis_client))
    monkeypatch.setattr(
        webhook_delivery, "_receiver_holds", lambda: ReceiverHolds(lambda: redis_client, keys)
    )
    return keys


def attempt(event: dict[str, Any], task_id: str, retries: int, job_id: str, url: str) -> str:
    """The task run as a worker runs delivery `task_id` of `event` after `retries` retries."""
    task = webhook_delivery.deliver_webhook
    task.push_request(id=task_id, retries=retries)
    try:
        return task.run("job", job_id, url, event, time.time())
    finally:
        task.pop_request()

"""A real local HTTP receiver for webhook tests: answers each path with its scripted statuses in
turn (then 200) and records every delivery."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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

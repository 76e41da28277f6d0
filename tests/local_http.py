"""A real HTTP server on a free loopback port, serving from a thread: for the SDK's tests of
what a producer answers at its worst (dropped streams, 503s, separators in event data), and an
ASGI app (a producer, a proxy in front of one) under uvicorn for a browser or the CLI."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import uvicorn
from starlette.types import ASGIApp

S = TypeVar("S", bound="LocalServer")


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that answers whole bodies with their length and logs nothing to the test's
    output."""

    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {**(headers or {}), "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


class LocalServer(ThreadingHTTPServer):
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def serving(server: S) -> Iterator[S]:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()


@contextmanager
def served_app(app: ASGIApp, port: int, lifespan: str = "auto") -> Iterator[str]:
    """`app` served by uvicorn on 127.0.0.1:`port` from a thread, until the block ends; its URL."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, lifespan=lifespan, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"the app on port {port} did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)

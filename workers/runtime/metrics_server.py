"""Celery worker bootstep serving `/metrics` (Prometheus) and `/healthz` (the consumer thread is
alive and no engine died: the liveness probe; 503 while the engines load) on
`CONVEYOR_METRICS_PORT`; 0 turns it off. It starts before the stream consumer: a port in use
stopped a worker that had read a micro-batch, which Celery, not fully started, did not drain."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from celery import bootsteps
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shared.settings import get_settings
from workers.runtime.consumer_runtime import ConsumerRuntime
from workers.runtime.start_refusal import refuse_start

log = logging.getLogger(__name__)
# How long a connection may keep the server waiting for its request (a scrape sends it at once):
# one that connected and sent nothing held its thread for ever, a thread per such connection.
READ_TIMEOUT_S = 10.0


class MetricsServer(bootsteps.StartStopStep):
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.server: ThreadingHTTPServer | None = None

    def start(self, worker: Any) -> None:
        port = get_settings().metrics_port
        if port == 0:
            return
        try:
            self.server = ThreadingHTTPServer(("0.0.0.0", port), _handler(worker))
        except OSError as exc:  # named by its setting: the bare OSError named none
            refuse_start(f"CONVEYOR_METRICS_PORT={port}: {exc.strerror}")
        threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True).start()
        log.info("metrics on :%d", port)

    def stop(self, worker: Any) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _handler(worker: Any) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        head_only = False  # this request is a HEAD: the headers GET would send, no body
        timeout = READ_TIMEOUT_S  # the socket's, from the connection's start (StreamRequestHandler)

        def do_GET(self) -> None:
            """By path alone: a scrape job's `params:` add a query string, which read 404.
            Metrics in the text format whatever the Accept asks: a vLLM engine's metrics
            clash in OpenMetrics (`prompt_tokens_by_source`), which fails a whole scrape."""
            path = urlsplit(self.path).path
            if path == "/metrics":
                self._reply(200, generate_latest(), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._health(getattr(worker, "conveyor_runtime", None))
            else:
                self._reply(404, b"not found", "text/plain")

        def do_HEAD(self) -> None:
            """As GET without the body: a monitor's `HEAD /healthz` got 501, the worker down."""
            self.head_only = True
            try:
                self.do_GET()
            finally:
                self.head_only = False

        def _health(self, runtime: ConsumerRuntime | None) -> None:
            """503 naming the partitions whose engine died: an idle worker's dead engine is
            seen by no loop, and only the probe's restart mends it."""
            if runtime is None or not runtime.alive:
                self._reply(503, b"down", "text/plain")
            elif dead := runtime.dead_engines:
                self._reply(503, f"engine died: {', '.join(dead)}".encode(), "text/plain")
            else:
                self._reply(200, b"ok", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not self.head_only:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Scrapes every few seconds would flood the worker's log."""

    return Handler

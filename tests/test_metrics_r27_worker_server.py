"""The worker's metrics server closes a connection that sends no request within its read
timeout (one that connected and sent nothing held a thread for ever), and its engine-time
histogram tells calls of minutes apart (topped at 60 s, every slower call read 60). A real
server on a free port, real sockets, the real Prometheus client."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
from prometheus_client import generate_latest

from shared.metrics import ENGINE_TIME
from workers.runtime import metrics_server


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadingHTTPServer]:
    monkeypatch.setattr(metrics_server, "READ_TIMEOUT_S", 0.3)
    served = ThreadingHTTPServer(("127.0.0.1", 0), metrics_server._handler(object()))
    threading.Thread(target=served.serve_forever, daemon=True).start()
    try:
        yield served
    finally:
        served.shutdown()
        served.server_close()


def test_a_connection_that_sends_nothing_is_closed(server: ThreadingHTTPServer) -> None:
    with socket.create_connection(server.server_address[:2], timeout=30) as idle:
        assert idle.recv(1) == b""  # closed by the server (a timeout here raises instead)
    with socket.create_connection(server.server_address[:2], timeout=30) as scrape:
        scrape.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert scrape.recv(12) == b"HTTP/1.0 200"


def test_engine_calls_of_minutes_fall_in_buckets_of_their_own() -> None:
    ENGINE_TIME.labels("r27-model", "slow").observe(90)
    ENGINE_TIME.labels("r27-model", "slow").observe(200)
    text = generate_latest().decode()

    def count(le: str) -> float:
        line = f'conveyor_engine_seconds_bucket{{le="{le}",model="r27-model",variant="slow"}}'
        [value] = [row.split()[-1] for row in text.splitlines() if row.startswith(line)]
        return float(value)

    assert (count("60.0"), count("120.0"), count("300.0")) == (0, 1, 2)

"""Benchmark measurement on small given inputs (no benchmark part runs, no stack): part A's
timed window holds no connects, and part B gives no verdict over failed requests."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from benchmarks.batching_efficiency import (
    NO_BATCHING,
    _saturation,
    capacity_errors,
    open_loop_point,
)
from benchmarks.batching_efficiency import targets as part_b_targets
from benchmarks.load import LoadResult, Target, closed_loop, drive
from benchmarks.pipeline_overhead import measure
from benchmarks.scales import SMOKE
from tests.conftest import until


class CountingServer(ThreadingHTTPServer):
    """A keep-alive JSON server on loopback that counts the connections it accepted."""

    daemon_threads = True
    accepted = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        self.accepted += 1
        super().process_request(request, client_address)


class Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"id": "j"}'
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per request would flood the test's output."""


@pytest.fixture
def server() -> Iterator[CountingServer]:
    httpd = CountingServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def _url(server: CountingServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/predict"


def test_a_closed_loop_opens_its_connections_before_its_window(server: CountingServer) -> None:
    """Each client's first request timed a TCP connect with it: at 128 clients, 128 handshakes
    and accepts inside the measured seconds and latencies."""
    target = Target.post(_url(server), [{"inputs": {}}])
    idle_at_start: list[int] = []

    def opened() -> None:
        idle_at_start.append(len(target.idle))

    load = drive(closed_loop(target, 4, 0.05, 40, measuring=opened))
    assert idle_at_start == [4]
    assert load.completed > 0 and load.errors == 0
    assert until(lambda: server.accepted >= 4, timeout=2) and server.accepted == 4


def test_part_a_measures_on_its_warm_up_connections(server: CountingServer) -> None:
    """Part A's warm-up closed its connections and the measured round opened new ones, inside
    the timed window and the CPU meter's: the server accepted every client twice."""
    scale = dataclasses.replace(SMOKE, seconds=0.05, warmup_s=0.05, max_requests=40, rounds=1)
    row = measure("system", _url(server), {}, 4, scale)
    assert until(lambda: server.accepted >= 4, timeout=2) and server.accepted == 4
    assert row["completed"] > 0 and row["errors"] == 0


def _point(label: str, answered: int, failed: int, span_s: float = 1.0) -> dict[str, Any]:
    """An open loop's row: `answered` answers `span_s` apart first to last, `failed` failures."""
    load = LoadResult(
        offered=answered + failed,
        sending_s=span_s,
        first_done=10.0,
        last_done=10.0 + span_s,
        latencies_s=[0.01] * answered,
        errors=failed,
    )
    return open_loop_point(label, float(answered), load)


def test_part_b_capacity_over_failed_requests_is_no_verdict() -> None:
    """Part B's targets carried no failed requests: a capacity whose failures left its rate out
    read met (or missed) as if every request had been answered."""
    points = [
        _point("max_queue_delay_ms 2", 401, 0),
        _point("max_queue_delay_ms 2", 901, 3),  # the capacity, with 3 failures
        _point(NO_BATCHING, 301, 2),  # the capacity, with 2 failures
    ]
    engine = [{"sentences_per_s": 250.0}, {"sentences_per_s": 1000.0}]
    share, gain = part_b_targets(engine, _saturation(points), capacity_errors(points))
    assert share.measured == pytest.approx(0.9) and not share.met
    assert share.verdict().startswith("no verdict (3 failed requests)")
    assert gain.errors == 5 and not gain.judged


def test_part_b_capacity_without_failures_keeps_its_verdict() -> None:
    points = [_point("max_queue_delay_ms 2", 901, 0), _point(NO_BATCHING, 301, 0)]
    engine = [{"sentences_per_s": 250.0}, {"sentences_per_s": 1000.0}]
    share, _ = part_b_targets(engine, _saturation(points), capacity_errors(points))
    assert share.met and share.verdict().startswith("met")

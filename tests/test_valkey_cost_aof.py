"""Part A's Valkey CPU is Conveyor's own: each system's window starts on a freshly rewritten
append-only file, so a rewrite that another system's writes set off (its forked child's CPU is
reaped into the server's) does not land in the next system's window. Part D counts the bytes
each job adds to that file."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis

from benchmarks.pipeline_overhead import measure
from benchmarks.pipeline_stack import compact_aof
from benchmarks.redis_cost import CommandStats, Window
from benchmarks.scales import SMOKE
from conveyor.embedded_valkey import start_embedded_valkey


class Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"id": "j"}'
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per request would flood the test's output."""


@pytest.fixture
def aof_url(tmp_path: Path) -> Iterator[str]:
    """A Valkey of its own writing an append-only file, as part A's runs."""
    server = start_embedded_valkey(tmp_path / "valkey", config={"appendonly": "yes"})
    try:
        yield server.connection_url
    finally:
        server.stop()


@pytest.fixture
def answering_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/predict"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _persistence(url: str) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    try:
        return dict(client.info("persistence"))
    finally:
        client.close()


def _grow(url: str, values: int = 2000) -> None:
    """Writes that grow the AOF past its last rewrite, as an earlier system's traffic did."""
    client = redis.Redis.from_url(url)
    try:
        client.mset({f"k{i}": "v" * 100 for i in range(values)})
        client.delete(*(f"k{i}" for i in range(values)))
    finally:
        client.close()


def test_compact_aof_returns_once_the_rewrite_ended(aof_url: str) -> None:
    _grow(aof_url)
    before = _persistence(aof_url)
    compact_aof(aof_url)
    after = _persistence(aof_url)
    assert after["aof_rewrites"] == before["aof_rewrites"] + 1
    assert not after["aof_rewrite_in_progress"] and not after["aof_rewrite_scheduled"]
    # the deleted keys' writes are gone from the file: it holds the (empty) dataset only
    assert after["aof_current_size"] < before["aof_current_size"] / 10


def test_part_a_rewrites_the_aof_before_a_valkey_systems_window(
    aof_url: str, answering_url: str
) -> None:
    _grow(aof_url)
    before = _persistence(aof_url)
    scale = dataclasses.replace(SMOKE, seconds=0.05, warmup_s=0.0, max_requests=20, rounds=1)
    row = measure("system", answering_url, {}, 2, scale, aof_url)
    assert row["completed"] > 0 and row["errors"] == 0
    after = _persistence(aof_url)
    assert after["aof_rewrites"] == before["aof_rewrites"] + 1, "no rewrite before the window"
    assert after["aof_current_size"] < before["aof_current_size"] / 10


def test_part_d_counts_the_bytes_a_window_adds_to_the_aof(aof_url: str) -> None:
    """Part D reports the AOF bytes per job beside the commands: what each write costs the
    server again, formatted into the file and written to disk."""
    stats = CommandStats(aof_url)
    try:
        before = stats.snapshot()
        stats.client.set("k", "v" * 1000)  # an AOF entry of over 1,000 bytes
        grown = Window.of(before, stats.snapshot())
        assert grown.aof_bytes is not None and 1000 < grown.aof_bytes < 1100
        # a rewrite between shrank the file: its growth is unknown, not negative
        compact_aof(aof_url)
        assert Window.of(before, stats.snapshot()).aof_bytes is None
        # idle growth at the idle window's rate is taken out, as idle commands are
        idle = Window(0.0, 1.0, Counter(), 100.0)
        assert Window(0.0, 2.0, Counter(), 1000.0).minus_idle(idle).aof_bytes == 800.0
    finally:
        stats.client.close()

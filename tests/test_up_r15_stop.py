"""`conveyor up` stops every child however its run ends, even when the state file it removes
first cannot be removed (a state dir remounted read-only): that error skipped the stop, and
`up` exited with its traceback, leaving every child running, unwaited."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import click
import pytest

from conveyor.commands import up
from conveyor.local_stack import STATE_FILE
from conveyor.producer_server import server_socket
from conveyor.stack import Stack, free_port

NO_REDIS = "redis://127.0.0.1:1/0"  # a stack that never talks to Redis
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_state_file_it_cannot_remove_still_stops_every_child(tmp_path: Path) -> None:
    """The run ends before any producer starts (their metrics dir is blocked by a file); the
    state file is a directory, which no one may unlink, root or not."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    child = stack.spawn("sleeper", SLEEPER, {})
    (tmp_path / "producer-metrics").touch()
    (tmp_path / STATE_FILE).mkdir()
    try:
        with pytest.raises(FileExistsError):  # what ended the run, not the removal's error
            up._serve(stack, tmp_path, "127.0.0.1", 1, producers=2, workers={})
        assert child.poll() is not None, "the stop was skipped: the child runs on"
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.wait()


class _Intruder(BaseHTTPRequestHandler):
    """Another server of this user's on the port, ready, under an instance id of its own."""

    def do_GET(self) -> None:
        body = json.dumps({"status": "ok", "instance": "intruder"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        """Quiet: its requests are the test's."""


@contextlib.contextmanager
def _intruder(port: int) -> Iterator[None]:
    """`_Intruder` bound as `up`'s producers bind when several (SO_REUSEPORT): one that took the
    port after `up` looked (`_refuse_unbindable`), say another `up` started at once on another
    state dir."""
    server = HTTPServer(("127.0.0.1", port), _Intruder, bind_and_activate=False)
    server.socket.close()
    server.socket = server_socket("127.0.0.1", port, share=True)
    server.server_activate()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_another_server_took_meanwhile_is_one_line_and_stops_its_producer(
    tmp_path: Path,
) -> None:
    """It ended `up` with a traceback of the RuntimeError. Two producers: only producers asked
    to share the port bind beside the intruder (a lone one fails to bind, tests/
    test_port_sharing_r41.py)."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    port = free_port()
    with _intruder(port), pytest.raises(click.ClickException) as refused:
        up._serve(stack, tmp_path, "127.0.0.1", port, producers=2, workers={})
    said = refused.value.message
    assert "answers as producer ['intruder']" in said and "has the port" in said, said
    assert not stack.processes, "its producer was not stopped"

"""A child's log (`<state dir>/<name>.log`) was appended to across runs and restarts and never
cut: a worker's line per micro-batch grows it by hundreds of MB a day. Past the stack's cap it
now moves to `<name>.log.1` (the one before dropped), and the child, still running, goes on
writing at the start of its emptied log."""

from __future__ import annotations

import sys
from pathlib import Path

from conveyor.stack import Stack
from tests.conftest import until

NO_REDIS = "redis://127.0.0.1:1/0"  # a stack that never talks to Redis
CAP = 1000
# Writes past the cap, then, once `go` exists, one line more and exits.
CHILD = """
import os, sys, time
sys.stdout.write({first!r}); sys.stdout.flush()
while not os.path.exists({go!r}):
    time.sleep(0.01)
sys.stdout.write("after\\n")
"""


def test_a_log_past_the_cap_is_rotated_and_written_on_from_its_start(tmp_path: Path) -> None:
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    stack.log_cap_bytes = CAP
    log, go = stack.log_path("chatty"), tmp_path / "go"
    first = "x" * CAP + "\n"
    try:
        child = stack.spawn(
            "chatty", [sys.executable, "-c", CHILD.format(first=first, go=str(go))], {}
        )
        until(lambda: log.stat().st_size > CAP)
        stack.cap_logs()
        assert log.read_text() == "" and (tmp_path / "chatty.log.1").read_text() == first
        go.touch()
        assert child.wait(timeout=30) == 0
    finally:
        stack.stop()
    assert log.read_bytes() == b"after\n"  # appended at its new end: no hole of NULs before it
    stack.cap_logs()  # under the cap: left as it is, the rotated one too
    assert log.read_bytes() == b"after\n"
    assert (tmp_path / "chatty.log.1").read_text() == first

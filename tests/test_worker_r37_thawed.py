"""A worker thawed after SIGSTOP (a paused container, a debugger, `kill -STOP`) found its reads'
timeouts run out while it was stopped, Redis's answers unread in the socket: it logged "redis
unavailable", blaming Redis for its own pause, and "reachable again" a moment later."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from conveyor.stack import Stack
from tests.conftest import own_valkey, until
from workers.partition import redis_backoff

# Reads time out 1.5 s after they are sent (the timeout past the block); the pause outlasts that,
# and what the worker counts as one (redis_backoff.PAUSED_S, 1 s, give or take its
# PAUSE_WATCH_S, 0.5 s). No shorter: a read slow by 1 s on a loaded machine, Redis's own,
# logged "redis unavailable" outside the pause.
TIMEOUTS = {"CONVEYOR_REDIS_TIMEOUT_S": "1.0", "CONVEYOR_BLOCK_MS": "500"}
PAUSE_S = 2.5


def _backoff_lines(stack: Stack, worker: str) -> list[str]:
    """What the worker's Redis backoff logged (its log is a JSON object a line)."""
    records = (
        json.loads(line)
        for line in stack.log_path(worker).read_text().splitlines()
        if line.startswith("{")
    )
    return [r["message"] for r in records if r["name"] == redis_backoff.__name__]


def test_a_thawed_worker_says_it_was_paused_not_that_redis_was_gone(tmp_path: Path) -> None:
    with own_valkey() as url:
        stack = Stack.create(tmp_path, url)
        try:
            pid = stack.start_worker("identity:default", "thawed", **TIMEOUTS)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(PAUSE_S)
            finally:
                os.kill(pid, signal.SIGCONT)
            until(lambda: _backoff_lines(stack, "thawed"))
        finally:
            stack.stop()  # the worker drains: what it logs after the thaw is all there
    said = _backoff_lines(stack, "thawed")
    assert said, said
    assert all(": this process was paused for at least " in line for line in said), said
    assert all("so a redis call timed out meanwhile (Timeout " in line for line in said)

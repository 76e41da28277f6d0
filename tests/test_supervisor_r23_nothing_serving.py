"""`conveyor up` stops, failed, once nothing it runs can serve: its embedded Valkey, which every
other child needs, or every producer given up on after its crash loop. It idled on, answering
nothing, and a service manager saw a running service it had no reason to restart."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.commands import up
from conveyor.stack import Stack, free_port
from tests.conftest import until
from tests.test_supervisor import BackoffSkipped

pytestmark = pytest.mark.slow
NO_REDIS = "redis://127.0.0.1:1/0"  # a stack that never talks to Redis
CRASH = "import sys; print('cannot start: data dir unreadable', flush=True); sys.exit(1)"
ASLEEP = "import time; time.sleep(600)"
# What the test waits at most for `_supervise` to return on its own: well past a crash loop
# (0.5 + 1 + 2 + 4 s of backoff, skipped here: `BackoffSkipped`), after which a SIGTERM ends it
# as it ends `up`.
GIVE_UP_WITHIN_S = 60.0
BAD_SETTING = {"CONVEYOR_PORT": "99999"}  # a producer that exits at once, naming it


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    # the supervisor's stop handlers, restored after: a later `conveyor up` would inherit them
    previous = {stop: signal.getsignal(stop) for stop in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield stack
    finally:
        stack.stop()
        for stop, handler in previous.items():
            signal.signal(stop, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _supervised_until_it_returns(stack: Stack) -> list[str]:
    """`up._supervise`'s answer, supervising with `BackoffSkipped`, which it must give on its
    own: a SIGTERM after `GIVE_UP_WITHIN_S` ends it otherwise, and fails the test."""
    fired = threading.Event()

    def terminate() -> None:
        fired.set()
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Timer(GIVE_UP_WITHIN_S, terminate)
    timer.start()
    try:
        failed = up._supervise(BackoffSkipped(stack, up._warn))
    finally:
        timer.cancel()
    assert not fired.is_set(), f"it idled on until SIGTERM, having given up on {failed}"
    return failed


def test_up_stops_once_its_embedded_valkey_is_given_up_on(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    stack.spawn("valkey", [sys.executable, "-c", CRASH], {})
    survivor = stack.spawn("survivor", [sys.executable, "-c", ASLEEP], {})
    assert _supervised_until_it_returns(stack) == ["valkey"]
    said = capsys.readouterr().err
    assert "valkey: failed (5 exits in a row" in said, said
    assert "| cannot start: data dir unreadable" in said, said
    assert said.rstrip().endswith("nothing left serving (see above): stopping"), said
    assert survivor.poll() is None  # stopped by `up`'s stop, not by the supervisor


def test_up_stops_once_every_producer_is_given_up_on(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    for name in ("producer-1", "producer-2"):
        stack.start_producer_process(port, name, "conveyor", **BAD_SETTING)
    assert sorted(_supervised_until_it_returns(stack)) == ["producer-1", "producer-2"]
    said = capsys.readouterr().err
    assert "bad setting: CONVEYOR_PORT='99999'" in said, said


def test_one_producer_left_keeps_the_stack_serving(stack: Stack) -> None:
    port = free_port()
    stack.start_producer_process(port, "producer-1", "conveyor", **BAD_SETTING)
    stack.start_producer_process(port, "producer-2", "conveyor")
    supervisor = BackoffSkipped(stack, lambda _line: None)

    def given_up() -> bool:
        supervisor.check()
        return supervisor.failed == ["producer-1"]

    until(given_up, timeout=GIVE_UP_WITHIN_S, every=0.2)
    assert stack.running("producer-2") and supervisor.serving

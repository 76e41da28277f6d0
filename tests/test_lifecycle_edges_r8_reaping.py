"""A stopped child's process group counts as gone once only zombies are left of it: an orphan's
zombie waits for an init to reap it, which a container's PID 1 does every few seconds or never,
and every stop (a scale-down's reap, `conveyor up`'s Ctrl-C) waited for it until its kill
deadline. The test process stands in for such an init: a child subreaper that reaps nothing."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.stack import Stack
from tests.conftest import until
from tests.test_local_autoscaler import NO_REDIS, WITH_ENGINE, _reaped

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a child subreaper is Linux's")


@contextlib.contextmanager
def init_that_never_reaps() -> Iterator[None]:
    """Orphans of this process's children become its own, and stay zombies until the end."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    assert prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    try:
        yield
    finally:
        prctl(PR_SET_CHILD_SUBREAPER, 0)


def _zombie(pid: int) -> bool:
    """Whether `pid` exited and waits to be reaped."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def _worker_with_engine(stack: Stack, tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    engine_pid = tmp_path / "engine.pid"
    process = stack.spawn("worker", [sys.executable, "-c", WITH_ENGINE, str(engine_pid)], {})
    until(engine_pid.exists)
    return process, int(engine_pid.read_text())


def _dies_at_its_signal(process: subprocess.Popen[bytes]) -> None:
    """`process` dies as soon as it is signalled, as a loaded machine may let it before its
    parent looks again: a signal to it returns once it exited (not yet reaped)."""
    send = process.send_signal

    def send_and_wait(sig: int) -> None:
        send(sig)
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)

    process.send_signal = send_and_wait  # type: ignore[method-assign]


def test_a_scaled_down_worker_takes_its_engine_at_once(tmp_path: Path) -> None:
    """A worker that died of a scale-down's SIGTERM before `terminate` looked at it was taken
    for one whose group got the signal, and its engine ran on until the kill deadline (the
    flaky `test_a_worker_ended_takes_its_engine_process_with_it[scaled down]`); then its zombie
    held the reap until the deadline too. Now the reaps forget the worker once its engine
    exited, long before the deadline."""
    stack = Stack.create(tmp_path / "stack", NO_REDIS)
    stack.settings = stack.settings.model_copy(update={"shutdown_grace_s": 600.0})
    with init_that_never_reaps():
        process, engine = _worker_with_engine(stack, tmp_path)
        _dies_at_its_signal(process)
        try:
            stack.terminate(["worker"])
            until(lambda: _reaped(stack))
            assert _zombie(engine)  # it exited, and no one reaped it
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine, signal.SIGKILL)
            os.waitpid(engine, 0)


def test_a_stop_does_not_wait_out_a_zombie_engine(tmp_path: Path) -> None:
    """`Stack.stop` (Ctrl-C) returns once the engine exited, zombie or not: it waited for the
    kill deadline, CONVEYOR_SHUTDOWN_GRACE_S + CONVEYOR_FORCED_EXIT_MARGIN_S, made long here."""
    stack = Stack.create(tmp_path / "stack", NO_REDIS)
    stack.settings = stack.settings.model_copy(update={"shutdown_grace_s": 600.0})
    with init_that_never_reaps():
        _, engine = _worker_with_engine(stack, tmp_path)
        stop = threading.Thread(target=stack.stop)
        try:
            stop.start()
            stop.join(timeout=10)  # a bound on the failure alone: it waited 600 s and more
            assert not stop.is_alive()
            assert _zombie(engine)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine, signal.SIGKILL)
            os.waitpid(engine, 0)  # the group gone, a stop still waiting returns
            stop.join()

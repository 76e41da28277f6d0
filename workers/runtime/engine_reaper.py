"""Ends an engine's own processes once their worker is gone, however it went. vLLM starts its
engine core with no parent-death signal: a worker killed outright (kill -9, the OOM killer) or
made to exit without closing its engine (a drain past the grace) left it running, 3.5 GB for
smollm2, wherever nothing killed the worker's whole process group or container (a bare
`celery worker` under a shell or a process manager that signals only its pid).

A small helper process holds the read end of a pipe whose only write end the worker holds: the
kernel closes it when the worker dies, by any signal. End of file with no word from the worker
means it did not close its engine, and the helper stops the processes it was given (SIGTERM, then
SIGKILL past `TERM_GRACE_S`), through pidfds the worker opened on its own children, so a pid
reused since is never hit: a child's number is not reused before its parent reaps it, while the
helper, opening them itself after its start, took whatever process held a number by then. A
process the worker forks later (another partition's engine core, a pool process) would inherit
that write end and hold the pipe open past the worker's death: forked children close it at
once."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import weakref
from collections.abc import Collection

from workers.runtime.process_tree import children

# argv: the seconds they get after SIGTERM, then the pidfds of the processes to end (inherited).
# SIGTERM first: vLLM's engine core shuts down on it, while multiprocessing's resource tracker
# (a child of the worker too) ignores it and exits, cleaning up, once its last user is gone.
_HELPER = """
import contextlib, select, signal, sys, time
fds = [int(fd) for fd in sys.argv[2:]]
if not sys.stdin.buffer.read():
    for fd in fds:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGTERM)
    deadline = time.monotonic() + float(sys.argv[1])
    for fd in fds:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
"""
# What the engine's processes get to stop after SIGTERM (an engine core took 5 to 10 s).
TERM_GRACE_S = 20.0
_CLOSED = b"closed"
# Every reaper whose write end this process holds: a forked child must not hold any.
_WATCHING: weakref.WeakSet[EngineReaper] = weakref.WeakSet()


class EngineReaper:
    """The helper watching one engine's processes; `release` once the engine closed them."""

    def __init__(self, pids: Collection[int]) -> None:
        # A session of its own: what is sent to the worker's process group (a terminal's Ctrl-C
        # or hangup, a group's SIGTERM) killed the helper, and the worker killed outright after
        # it left its engine running; only the worker's end may end the helper. Unbuffered: a
        # forked child closes a bare file, which takes no lock a parent's thread held at the fork.
        fds = _child_pidfds(pids)
        try:
            self._helper = subprocess.Popen(
                [sys.executable, "-c", _HELPER, str(TERM_GRACE_S), *map(str, fds)],
                stdin=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
                pass_fds=fds,
            )
        finally:
            for fd in fds:
                os.close(fd)
        _WATCHING.add(self)

    @classmethod
    def watching(cls, pids: Collection[int]) -> EngineReaper | None:
        """A reaper of `pids`; None when there are none, or off Linux (no pidfds, nor /proc to
        find them by)."""
        return cls(pids) if pids and sys.platform == "linux" else None

    def release(self) -> None:
        """The engine closed its processes: the helper exits without touching them."""
        self._helper.communicate(_CLOSED)

    def _let_go(self) -> None:
        """In a forked child: the worker's death must close the pipe, whoever it forked."""
        if self._helper.stdin is not None:
            self._helper.stdin.close()


def _child_pidfds(pids: Collection[int]) -> list[int]:
    """Pidfds on those of `pids` that are this process's children, their list read after the
    opens (so of the processes the pidfds hold); none for one gone already, or one whose number
    another process took since it was listed (none of this worker's to end)."""
    opened: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            opened[pid] = os.pidfd_open(pid)
    mine = set(children(os.getpid()))
    for pid in opened.keys() - mine:
        os.close(opened.pop(pid))
    return list(opened.values())


def _let_go_in_child() -> None:
    for reaper in list(_WATCHING):
        reaper._let_go()


os.register_at_fork(after_in_child=_let_go_in_child)

"""Ends an engine's own processes once their worker is gone, however it went. vLLM starts its
engine core with no parent-death signal: a worker killed outright (kill -9, the OOM killer) or
made to exit without closing its engine (a drain past the grace) left it running, 3.5 GB for
smollm2, wherever nothing killed the worker's whole process group or container (a bare
`celery worker` under a shell or a process manager that signals only its pid).

A small helper process holds the read end of a pipe whose only write end the worker holds: the
kernel closes it when the worker dies, by any signal. End of file with no word from the worker
means it did not close its engine, and the helper stops the processes it was given (SIGTERM, then
SIGKILL past `TERM_GRACE_S`), through pidfds opened while they ran, so a pid reused since is
never hit."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Collection

# argv: the seconds they get after SIGTERM, then the pids to end (one gone already is skipped).
# SIGTERM first: vLLM's engine core shuts down on it, while multiprocessing's resource tracker
# (a child of the worker too) ignores it and exits, cleaning up, once its last user is gone.
_HELPER = """
import contextlib, os, select, signal, sys, time
fds = []
for pid in sys.argv[2:]:
    with contextlib.suppress(ProcessLookupError):
        fds.append(os.pidfd_open(int(pid)))
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


class EngineReaper:
    """The helper watching one engine's processes; `release` once the engine closed them."""

    def __init__(self, pids: Collection[int]) -> None:
        # A session of its own: what is sent to the worker's process group (a terminal's Ctrl-C
        # or hangup, a group's SIGTERM) killed the helper, and the worker killed outright after
        # it left its engine running; only the worker's end may end the helper.
        self._helper = subprocess.Popen(
            [sys.executable, "-c", _HELPER, str(TERM_GRACE_S), *map(str, pids)],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )

    @classmethod
    def watching(cls, pids: Collection[int]) -> EngineReaper | None:
        """A reaper of `pids`; None when there are none, or off Linux (no pidfds, nor /proc to
        find them by)."""
        return cls(pids) if pids and sys.platform == "linux" else None

    def release(self) -> None:
        """The engine closed its processes: the helper exits without touching them."""
        self._helper.communicate(_CLOSED)

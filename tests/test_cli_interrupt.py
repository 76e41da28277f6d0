"""Ctrl-C ends a command with 130, as a shell reports one SIGINT ended: a wait interrupted
exited 1 (click's own status), which the waiting commands document as "the job ended
otherwise", so a script took a job still queued for a failed one."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

CONVEYOR = str(Path(sys.executable).parent / "conveyor")


def test_ctrl_c_during_a_wait_exits_130() -> None:
    with socket.socket() as silent:  # a producer that takes the request and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        waiting = subprocess.Popen(
            [CONVEYOR, "jobs", "get", "0" * 32, "--wait", "60", "--url", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            connection, _ = silent.accept()  # the command waits on its answer now
            with connection:
                connection.recv(1024)
                waiting.send_signal(signal.SIGINT)
                _, stderr = waiting.communicate(timeout=60)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
    assert waiting.returncode == 130, stderr
    assert stderr.strip() == "Aborted!", stderr

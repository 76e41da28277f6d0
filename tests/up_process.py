"""`conveyor up` as a user runs it, for the tests: on a free port, read until its banner ends
(its later lines keep arriving in `lines`), stopped on the way out with Ctrl-C, which must end
it cleanly (exit status 0)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.stack import free_port

CONVEYOR = Path(sys.executable).parent / "conveyor"
BANNER_END = "Ctrl-C stops everything"


@dataclass
class Up:
    port: int
    lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def conveyor_up(
    state_dir: Path,
    models: str,
    env: dict[str, str],
    conveyor: Path = CONVEYOR,
    cwd: Path | None = None,
    options: tuple[str, ...] = (),
) -> Iterator[Up]:
    up = Up(free_port())
    command = [str(conveyor), "up", "--port", str(up.port), "--models", models, *options]
    process = subprocess.Popen(
        [*command, "--state-dir", str(state_dir)],
        env={**env, "PYTHONUNBUFFERED": "1"},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        while not any(BANNER_END in line for line in up.lines):
            line = process.stdout.readline()
            assert line, "".join(up.lines)  # it ended before it was up
            up.lines.append(line)
        threading.Thread(target=up.lines.extend, args=(process.stdout,), daemon=True).start()
        yield up
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, "".join(up.lines)
    finally:
        if process.poll() is None:  # the test failed: stop it as Ctrl-C does, so it stops its
            _stop(process)  # Valkey, producers and workers (a SIGKILL would orphan them)


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

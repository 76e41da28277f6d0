"""An LLM worker's engine core (vLLM's, a process of its own) outlived a worker killed outright
wherever nothing killed the worker's whole process group or container: 3.5 GB each for
smollm2. The engine now gets a reaper that ends it once its worker is gone, however it went,
and leaves it alone once the worker closed it. A real worker process and a real engine process
stand in for vLLM's (whose start takes a minute)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, until

# A worker: starts an engine process, watches it with a reaper, and prints the engine's pid;
# with `release` it then closes the engine as VllmEngine.close does (the reaper released
# while the engine still runs: it must not be touched). It sleeps until killed.
WORKER = """
import subprocess, sys, time
from workers.runtime.engine_reaper import EngineReaper
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
reaper = EngineReaper.watching([engine.pid])
if sys.argv[1] == "release":
    reaper.release()
print(engine.pid, flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def spawned_worker(script: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """A worker running `script` (with `args`) in a session of its own, and the pids it prints
    on its first line (its engine's first); on the way out it is killed with its whole process
    group, which holds the engines and children it started (the reaper's helper, in a session
    of its own, ends with the worker)."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert process.stdout is not None
        yield process, [int(pid) for pid in process.stdout.readline().split()]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def worker(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The worker (killed with all it left) and its engine's pid."""
    with spawned_worker(WORKER, request.param) as (process, [engine]):
        yield process, engine


@pytest.mark.parametrize("worker", ["keep"], indirect=True)
def test_an_engine_process_ends_with_its_killed_worker(
    worker: tuple[subprocess.Popen[str], int],
) -> None:
    process, engine = worker
    process.kill()  # as kill -9 or the OOM killer: no code of the worker runs
    process.wait()
    until(lambda: not _running(engine), timeout=10)


@pytest.mark.parametrize("worker", ["release"], indirect=True)
def test_a_closed_engine_is_left_alone(worker: tuple[subprocess.Popen[str], int]) -> None:
    process, engine = worker
    process.kill()
    process.wait()
    assert _running(engine)  # the reaper exited at its release: nothing watches it now

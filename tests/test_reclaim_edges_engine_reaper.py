"""A Ctrl-C on a bare `celery worker` in a terminal sends SIGINT to the worker's whole process
group: the engine reaper's helper died of it (a KeyboardInterrupt traceback), and an engine whose
worker was then killed outright was left running, 3.5 GB for smollm2. The helper now ends only
with its worker. A real worker process and a real engine process stand in for celery's and
vLLM's, each living through the SIGINT as those do."""

from __future__ import annotations

import os
import signal
import time

from tests.conftest import until
from tests.test_worker_engine_reaper import _running, spawned_worker

# An engine that lives through SIGINT, ready once it says so.
ENGINE = (
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(); time.sleep(60)"
)
# A worker: its engine watched by a reaper, then a SIGINT handler of its own, as celery's (a first
# Ctrl-C starts a warm shutdown); prints the engine's pid and sleeps until killed.
WORKER = f"""
import signal, subprocess, sys, time
from workers.runtime.engine_reaper import EngineReaper
engine = subprocess.Popen([sys.executable, "-c", {ENGINE!r}], stdout=subprocess.PIPE)
engine.stdout.readline()
reaper = EngineReaper.watching([engine.pid])
signal.signal(signal.SIGINT, lambda *_: None)
print(engine.pid, flush=True)
time.sleep(60)
"""


def test_a_ctrl_c_leaves_the_reaper_guarding_the_engine() -> None:
    with spawned_worker(WORKER) as (process, [engine]):
        os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C
        time.sleep(0.2)  # taken by the group, the worker and its engine live on
        assert process.poll() is None and _running(engine)
        process.kill()  # then killed outright: no code of the worker runs
        process.wait()
        until(lambda: not _running(engine), timeout=5)

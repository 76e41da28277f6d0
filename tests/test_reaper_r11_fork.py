"""A process the worker forked after an engine's reaper was made (a second vLLM partition's
engine core, a pool process) inherited the write end of that reaper's pipe: the worker killed
outright, the pipe never reached end of file while the forked process lived, and the first engine
ran on, 3.5 GB for smollm2. Forked children now close every reaper's write end. A real worker,
a real engine process and a plain forked child stand in for celery's and vLLM's."""

from __future__ import annotations

from tests.conftest import until
from tests.test_worker_engine_reaper import _running, spawned_worker

# A worker: an engine watched by a reaper, then a child forked as multiprocessing's fork start
# method does, unwatched and living on; prints both pids and sleeps until killed.
WORKER = """
import os, subprocess, sys, time
from workers.runtime.engine_reaper import EngineReaper
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
reaper = EngineReaper.watching([engine.pid])
forked = os.fork()
if forked == 0:
    time.sleep(60)
    os._exit(0)
print(engine.pid, forked, flush=True)
time.sleep(60)
"""


def test_a_child_forked_after_the_reaper_leaves_it_guarding_the_engine() -> None:
    with spawned_worker(WORKER) as (process, [engine, forked]):
        process.kill()  # as kill -9 or the OOM killer: no code of the worker runs
        process.wait()
        until(lambda: not _running(engine), timeout=5)
        assert _running(forked)  # not the reaper's to end: it only let go of the pipe

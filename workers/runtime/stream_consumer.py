"""Celery worker bootstep that serves Conveyor's partition streams: started after the worker's
pool and its heartbeat, stopped before the heartbeat on warm shutdown (stop reading, finish the
batch in hand, acknowledge, exit)."""

from __future__ import annotations

import os
import threading
from typing import Any

from celery import bootsteps
from celery.worker import state as celery_state

from shared.settings import get_settings
from workers.runtime.consumer_runtime import ConsumerRuntime
from workers.runtime.heartbeat import WorkerHeartbeat

# What Celery gets to shut down after a crash, past the grace (a webhook delivery in hand), before
# the exit is forced.
FORCED_EXIT_MARGIN_S = 20.0


class StreamConsumer(bootsteps.StartStopStep):
    # after the heartbeat: it shows `warming` while engines load, `draining` while this drains
    requires = ("celery.worker.components:Pool", WorkerHeartbeat)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.runtime: ConsumerRuntime | None = None

    def start(self, worker: Any) -> None:
        self.runtime = ConsumerRuntime(get_settings(), on_crash=_exit_worker)
        self.runtime.start()
        worker.conveyor_runtime = self.runtime

    def stop(self, worker: Any) -> None:
        if self.runtime is not None:
            self.runtime.stop()
            self.runtime = None


def _exit_worker() -> None:
    """Ask Celery's main loop to shut the worker down with EX_SOFTWARE, as a signal would (it
    checks this flag on every turn): the consumer thread cannot stop it from where it runs.
    The exit is forced if the process outlives that shutdown: an engine call that never
    returns (queue.max_run_s) holds a pool thread, which Python waits for at exit, for ever."""
    if celery_state.should_stop == os.EX_SOFTWARE:
        return  # asked already (before the engines closed), its exit forced already
    celery_state.should_stop = os.EX_SOFTWARE
    delay_s = get_settings().shutdown_grace_s + FORCED_EXIT_MARGIN_S
    forced = threading.Timer(delay_s, os._exit, [os.EX_SOFTWARE])
    forced.daemon = True
    forced.start()

"""Celery worker bootstep that serves Conveyor's partition streams: started after the worker's
pool, its heartbeat and its metrics server (bound before anything is read, so a port in use
stops the worker with no job in hand), stopped before them on warm shutdown (stop reading,
finish the batch in hand, acknowledge, exit)."""

from __future__ import annotations

import os
import threading
from typing import Any

from celery import bootsteps
from celery.worker import state as celery_state

from shared.settings import get_settings
from workers.runtime.consumer_runtime import ConsumerRuntime
from workers.runtime.heartbeat import WorkerHeartbeat
from workers.runtime.memory_ceiling import RECYCLED
from workers.runtime.metrics_server import MetricsServer


class StreamConsumer(bootsteps.StartStopStep):
    # after the heartbeat: it shows `warming` while engines load, `draining` while this drains
    requires = ("celery.worker.components:Pool", WorkerHeartbeat, MetricsServer)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.runtime: ConsumerRuntime | None = None

    def start(self, worker: Any) -> None:
        self.runtime = ConsumerRuntime(
            get_settings(), on_crash=_exit_worker, on_recycle=_recycle_worker
        )
        try:  # SIGTERM while the engines load raises WorkerShutdown here, as Celery's loop does
            self.runtime.start(celery_state.maybe_shutdown)
        except BaseException:
            # Celery stops no step of a worker that did not fully start; the runtime stopped
            # itself, but a load it gave up may still hold a pool thread
            _force_exit(get_settings().forced_exit_margin_s)
            raise
        worker.conveyor_runtime = self.runtime

    def stop(self, worker: Any) -> None:
        if self.runtime is not None:
            if not self.runtime.stop():  # its jobs in hand stay pending, for a reclaim
                _force_exit(get_settings().forced_exit_margin_s)
            self.runtime = None


def _exit_worker() -> None:
    """Ask Celery's main loop to shut the worker down with EX_SOFTWARE, as a signal would (it
    checks this flag on every turn): the consumer thread cannot stop it from where it runs."""
    if celery_state.should_stop == os.EX_SOFTWARE:
        return  # asked already (before the engines closed), its exit forced already
    celery_state.should_stop = os.EX_SOFTWARE
    settings = get_settings()
    _force_exit(settings.shutdown_grace_s + settings.forced_exit_margin_s)


def _recycle_worker() -> None:
    """Ask Celery's main loop for a warm shutdown that exits with RECYCLED (its memory passed
    CONVEYOR_WORKER_MAX_MEMORY_MB): the stop runs as a SIGTERM's does, forced past the grace
    as ever. A stop asked for already (a SIGTERM, a crash) keeps its own status."""
    if celery_state.should_stop is None:
        celery_state.should_stop = RECYCLED


def _force_exit(delay_s: float) -> None:
    """Exit with EX_SOFTWARE if the process still runs `delay_s` from now: an engine call that
    does not return (queue.max_run_s, a drain past the grace, a load given up) holds a pool
    thread (asyncio.to_thread, a staged engine's executors), which Python waits for at exit,
    for as long as the call lasts."""
    forced = threading.Timer(delay_s, os._exit, [os.EX_SOFTWARE])
    forced.daemon = True
    forced.start()

"""Celery worker bootstep that serves Conveyor's partition streams: started after the worker's
pool, its heartbeat and its metrics server (bound before anything is read, so a port in use
stops the worker with no job in hand), stopped before them on warm shutdown (stop reading,
finish the batch in hand, acknowledge, exit)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from celery import bootsteps
from celery.worker import state as celery_state

from shared.settings import get_settings
from workers.runtime.consumer_runtime import ConsumerRuntime
from workers.runtime.heartbeat import WorkerHeartbeat
from workers.runtime.memory_ceiling import RECYCLED
from workers.runtime.metrics_server import MetricsServer
from workers.runtime.start_refusal import refuse_start

log = logging.getLogger(__name__)


class StreamConsumer(bootsteps.StartStopStep):
    # after the heartbeat: it shows `warming` while engines load, `draining` while this drains
    requires = ("celery.worker.components:Pool", WorkerHeartbeat, MetricsServer)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.runtime: ConsumerRuntime | None = None

    def start(self, worker: Any) -> None:
        _exit_on_a_second_sigterm()
        try:  # SIGTERM while the engines load raises WorkerShutdown here, as Celery's loop does
            self.runtime = ConsumerRuntime(
                get_settings(), on_crash=_exit_worker, on_recycle=_recycle_worker
            )
            self.runtime.start(celery_state.maybe_shutdown)
        except BaseException as exc:
            # Celery stops no step of a worker that did not fully start; the runtime stopped
            # itself, but a load it gave up may still hold a pool thread
            _force_exit(get_settings().forced_exit_margin_s)
            _leave_registry(worker)
            if isinstance(exc, Exception):  # not a stop asked for: Celery's WorkerShutdown
                # Celery's own report of it was two tracebacks with no line that said why
                refuse_start(exc)
            raise
        worker.conveyor_runtime = self.runtime

    def stop(self, worker: Any) -> None:
        if self.runtime is not None:
            if not self.runtime.stop():  # its jobs in hand stay pending, for a reclaim
                _force_exit(get_settings().forced_exit_margin_s)
            self.runtime = None


def _exit_on_a_second_sigterm() -> None:
    """Wrap Celery's SIGTERM handler (set before any step starts) so that a second SIGTERM stops
    the worker at once, as a second Ctrl-C stops a Celery worker: Celery ignores every SIGTERM
    after the first, and a drain held up (an engine call that outlasts it) ran out its grace.
    The jobs in hand stay pending, for a reclaim, as after a kill."""
    celerys = signal.getsignal(signal.SIGTERM)
    if not callable(celerys):  # not Celery's: left as it is
        return
    asked = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal asked
        if asked:
            log.warning("a second SIGTERM: the worker exits now, its jobs in hand left pending")
            os._exit(os.EX_SOFTWARE)
        asked = True
        celerys(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)


def _leave_registry(worker: Any) -> None:
    """Stop the heartbeat of a worker whose start failed, so that it leaves the registry as it
    exits: Celery stops none of its steps then, and it showed as `warming` 10 s more."""
    for step in worker.steps:
        if isinstance(step, WorkerHeartbeat):
            step.stop(worker)


def _exit_worker() -> None:
    """Ask Celery's main loop to shut the worker down with EX_SOFTWARE, as a signal would (it
    checks this flag on every turn): the consumer thread cannot stop it from where it runs.
    The runtime asks once (`ConsumerRuntime._crash`)."""
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

"""Celery worker bootstep that serves Conveyor's partition streams: started after the worker's
pool and its heartbeat, stopped before the heartbeat on warm shutdown (stop reading, finish the
batch in hand, acknowledge, exit)."""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from shared.settings import get_settings
from workers.runtime.consumer_runtime import ConsumerRuntime
from workers.runtime.heartbeat import WorkerHeartbeat


class StreamConsumer(bootsteps.StartStopStep):
    # after the heartbeat: it shows `warming` while engines load, `draining` while this drains
    requires = ("celery.worker.components:Pool", WorkerHeartbeat)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.runtime: ConsumerRuntime | None = None

    def start(self, worker: Any) -> None:
        self.runtime = ConsumerRuntime(get_settings())
        self.runtime.start()
        worker.conveyor_runtime = self.runtime

    def stop(self, worker: Any) -> None:
        if self.runtime is not None:
            self.runtime.stop()
            self.runtime = None

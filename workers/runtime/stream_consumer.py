"""Celery worker bootstep that serves Conveyor's partition streams: started after the worker's
pool, stopped on warm shutdown (stop reading, finish the batch in hand, acknowledge, exit)."""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from shared.settings import get_settings
from workers.runtime.consumer_runtime import ConsumerRuntime


class StreamConsumer(bootsteps.StartStopStep):
    requires = ("celery.worker.components:Pool",)

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

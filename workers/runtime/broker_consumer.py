"""Celery's consumer with a backoff between its restarts. On a broker that accepts connections
but refuses writes (NOREPLICAS, MISCONF, a failover's old master) each restart fails at once,
and Celery started the next one at once: several restarts a second, each a new connection,
for as long as the refusal lasted (its only brake, a second's pause after five restarts within
one). Now each restart of a spell waits twice as long as the one before, from `FIRST_S` up to
`CAP_S` with jitter, as the worker's own Redis loops do (`workers/partition/redis_backoff.py`);
its log is two lines as before (`workers/runtime/broker_outage_log.py`)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

from celery.worker import state as celery_state
from celery.worker.consumer import Consumer as CeleryConsumer

FIRST_S = 0.1
CAP_S = 5.0
# A run this long before its error ends the spell: the next restart waits FIRST_S again.
STEADY_AFTER_S = 10.0
# How often a wait looks whether the worker was asked to stop (Celery's signal handlers only
# set a flag, which its loop reads between restarts).
SLICE_S = 0.1


def stoppable_sleep(delay_s: float) -> None:
    """Sleep `delay_s`, ended by a stop as Celery's own loop ends (WorkerShutdown): a
    consumer restart's wait, and a webhook delivery's wait to queue its next attempt."""
    deadline = time.monotonic() + delay_s
    while (left := deadline - time.monotonic()) > 0:
        celery_state.maybe_shutdown()
        time.sleep(min(SLICE_S, left))
    celery_state.maybe_shutdown()


class RestartWait:
    """The waits of one spell of consumer restarts; `clock` is monotonic seconds."""

    def __init__(
        self,
        pause: Callable[[float], None] = stoppable_sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pause = pause
        self.clock = clock
        self.attempt = 0
        self.restarted_at = -math.inf

    def wait(self) -> None:
        """Before a restart: the longer the spell, the longer the wait."""
        if self.clock() - self.restarted_at >= STEADY_AFTER_S:
            self.attempt = 0
        self.pause(min(CAP_S, FIRST_S * 2**self.attempt) * random.uniform(0.5, 1.0))
        if FIRST_S * 2**self.attempt < CAP_S:  # at the cap it stays: no float overflow
            self.attempt += 1
        self.restarted_at = self.clock()


class Consumer(CeleryConsumer):
    """Celery's consumer (`worker_consumer`, workers/app.py) that waits before it restarts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.restart_wait = RestartWait()

    def on_connection_error_before_connected(self, exc: BaseException) -> None:
        super().on_connection_error_before_connected(exc)
        self.restart_wait.wait()

    def on_connection_error_after_connected(self, exc: BaseException) -> None:
        super().on_connection_error_after_connected(exc)
        self.restart_wait.wait()

"""Celery's consumer on a Redis that refuses writes (NOREPLICAS here) restarted at once, about
seven times a second, for as long as the refusal lasted. A real consumer on a real Valkey with
`min-replicas-to-write 1` now waits before each restart, longer each time; the waits are
recorded, not slept."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery.concurrency.solo import TaskPool
from celery.exceptions import WorkerShutdown
from celery.worker import state as celery_state
from kombu.asynchronous.timer import Timer

from conveyor.stack import Stack
from shared.celery_broker import broker_app
from workers.runtime.broker_consumer import CAP_S, FIRST_S, Consumer, RestartWait

RESTARTS = 3


@pytest.fixture
def refusing(bare_stack: Stack) -> Iterator[str]:
    """The stack's Redis refusing writes: too few replicas (it has none)."""
    client = bare_stack.client()
    client.config_set("min-replicas-to-write", 1)
    try:
        yield bare_stack.redis_url
    finally:
        client.config_set("min-replicas-to-write", 0)
        client.close()


@pytest.fixture
def stop_flag() -> Iterator[None]:
    """Celery's process-wide stop flag, as it was for the next test."""
    try:
        yield
    finally:
        celery_state.should_stop = None


@pytest.mark.usefixtures("stop_flag")
def test_a_broker_refusing_writes_restarts_the_consumer_after_growing_waits(
    refusing: str,
) -> None:
    waits: list[float] = []

    def recorded(delay_s: float) -> None:
        waits.append(delay_s)
        if len(waits) == RESTARTS:  # as a SIGTERM does: Celery's loop ends the consumer
            celery_state.should_stop = 0

    consumer = _consumer(refusing)
    consumer.restart_wait = RestartWait(pause=recorded)
    # without waits the loop never asks the pause to stop it: this ends it, the test failed
    guard = threading.Timer(5.0, setattr, (celery_state, "should_stop", 0))
    guard.start()
    try:
        with pytest.raises(WorkerShutdown):
            consumer.start()
    finally:
        guard.cancel()
        if consumer.connection:
            consumer.connection.close()
    assert len(waits) == RESTARTS, waits
    assert waits == sorted(waits) and waits[0] <= FIRST_S < waits[-1] <= CAP_S, waits


def test_a_steady_run_starts_the_waits_over() -> None:
    now = [0.0]
    waits: list[float] = []
    wait = RestartWait(pause=waits.append, clock=lambda: now[0])
    for _ in range(30):  # a long spell: at the cap, never past it
        wait.wait()
    assert max(waits) <= CAP_S < 2 * min(waits[-5:])
    now[0] += 60.0  # served a minute, then lost the broker
    wait.wait()
    assert waits[-1] <= FIRST_S


def _consumer(broker_url: str) -> Consumer:
    """A worker's consumer, with what of the worker it needs, on `broker_url`."""
    app = broker_app(broker_url, set_as_current=False)
    app.conf.worker_cancel_long_running_tasks_on_connection_loss = True  # as workers/app.py
    pool = TaskPool()
    pool.start()
    controller = SimpleNamespace(use_eventloop=False, state=celery_state, semaphore=None)
    return Consumer(
        lambda *_: None,
        app=app,
        pool=pool,
        timer=Timer(),
        controller=controller,
        hub=None,
        without_mingle=True,
        without_gossip=True,
        without_heartbeat=True,
    )

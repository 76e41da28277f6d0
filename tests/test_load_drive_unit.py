"""`benchmarks.load.drive` ends a load when pytest-timeout's SIGALRM handler raises inside it,
wherever the main thread was: uvloop only logs what a handler raises in its own callback, and a
background task that gets it dies unseen (vLLM's output handler would), so the timeout's failure
once vanished and a stalled benchmark ran on until CI's own limit ended the whole run."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import pytest

from benchmarks.load import drive


class Alarm(BaseException):
    """Raised by the SIGALRM handler, as pytest-timeout raises its (BaseException) failure."""


def _ring(signum: int, frame: object) -> None:
    raise Alarm


@pytest.fixture
def alarm_handler() -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _ring)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


async def _forever() -> None:
    while True:
        await asyncio.sleep(0.01)


def test_an_alarm_while_the_loop_waits_ends_the_load(alarm_handler: None) -> None:
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    with pytest.raises(Alarm):
        drive(asyncio.wait_for(_forever(), timeout=30))


def test_an_alarm_inside_a_background_task_ends_the_load(alarm_handler: None) -> None:
    tasks: list[asyncio.Task[None]] = []

    async def background() -> None:
        await asyncio.sleep(0.05)
        # Python runs a signal's handler as a call at whatever line the main thread is on
        signal.getsignal(signal.SIGALRM)(signal.SIGALRM, None)  # type: ignore[operator]

    async def load() -> None:
        tasks.append(asyncio.get_running_loop().create_task(background()))
        await _forever()

    with pytest.raises(Alarm):
        drive(asyncio.wait_for(load(), timeout=30))
    assert isinstance(tasks[0].exception(), Alarm)  # the task died of it, as vLLM's would
    assert signal.getsignal(signal.SIGALRM) is _ring  # handed back when the load ended


def test_a_load_that_ends_is_left_alone(alarm_handler: None) -> None:
    async def load() -> str:
        await asyncio.sleep(0.01)
        return "done"

    assert drive(load()) == "done"
    assert signal.getsignal(signal.SIGALRM) is _ring

"""`benchmarks.load.drive` ends a load when a signal handler raises inside it: uvloop only logs
what a handler raises, so pytest-timeout's SIGALRM failure once left a stalled benchmark running
until CI's own limit ended the whole run."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterator

import pytest

from benchmarks.load import drive


class Alarm(BaseException):
    """Raised by the SIGALRM handler, as pytest-timeout raises its (BaseException) failure."""


@pytest.fixture
def alarm_in_200ms() -> Iterator[None]:
    def ring(signum: int, frame: object) -> None:
        raise Alarm

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


async def _forever() -> None:
    while True:
        await asyncio.sleep(0.01)


def test_a_signal_handlers_exception_ends_a_stalled_load(alarm_in_200ms: None) -> None:
    with pytest.raises(Alarm):
        drive(asyncio.wait_for(_forever(), timeout=30))


def test_an_ordinary_callback_error_is_logged_and_the_load_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def load() -> str:
        asyncio.get_running_loop().call_soon(lambda: 1 / 0)
        await asyncio.sleep(0.05)
        return "done"

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        assert drive(load()) == "done"
    assert any(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)

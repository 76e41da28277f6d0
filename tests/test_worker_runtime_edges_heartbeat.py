"""The heartbeat thread ended on any error but Redis's (a measurement's ValueError, an OSError
reading /proc), with nothing said but the thread's traceback: the worker went on serving while
its beats stopped, so its hash expired and everything that reads them (the console, `scaling`
events, the autoscaler, queue ETAs) took its partitions for having no consumer. A beat that
fails is logged and the next one goes out as ever; a failing cost measurement costs the beat
only its costs."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import pytest
import redis

from shared.backlog import ServiceCost
from shared.keys import Keys
from shared.settings import Settings
from tests.conftest import REPO_ROOT, until
from workers.runtime import heartbeat
from workers.runtime.consumer_runtime import consumer_name
from workers.runtime.heartbeat import _Beater

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"


@pytest.fixture
def beater(redis_url: str) -> Iterator[_Beater]:
    """A beater on the fixtures' `tiny`, beating every 20 ms (not started)."""
    settings = Settings(
        redis_url=redis_url, model_repository=FIXTURES, models=["tiny"], worker_heartbeat_s=0.02
    )
    beater = _Beater(object(), settings)
    yield beater
    beater.stop()


def _beats_again(redis_url: str) -> None:
    """Waits for a beat written after this call: the thread beats on."""
    key = Keys().worker(consumer_name())
    with redis.Redis.from_url(redis_url) as client:
        client.delete(key)
        until(lambda: client.exists(key), timeout=30, every=0.01)  # a bound: beats are 20 ms apart


def test_a_beat_that_fails_is_logged_and_the_next_goes_out(
    beater: _Beater, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    failures = itertools.chain([OSError("cannot read /proc/self/statm")], itertools.repeat(None))
    refresh = beater._refresh

    def failing_once() -> None:
        if (failure := next(failures)) is not None:
            raise failure
        refresh()

    beater._refresh = failing_once  # type: ignore[method-assign]
    caplog.set_level(logging.ERROR, logger=heartbeat.__name__)
    beater.start()
    _beats_again(redis_url)
    assert beater._thread.is_alive()
    assert any("/proc/self/statm" in r.getMessage() + str(r.exc_info) for r in caplog.records)


def test_a_cost_measurement_that_fails_leaves_the_beat_itself(
    beater: _Beater, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    def failing() -> dict[tuple[str, str], ServiceCost]:
        raise ValueError("math domain error")

    beater.costs.measure = failing  # type: ignore[method-assign]
    caplog.set_level(logging.ERROR, logger=heartbeat.__name__)
    beater.start()
    _beats_again(redis_url)  # every beat's measurement fails: the beats still go out
    _beats_again(redis_url)
    assert beater._thread.is_alive()
    assert any("math domain error" in str(r.exc_info) for r in caplog.records)

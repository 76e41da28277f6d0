"""The worker heartbeat waited a whole period after each beat ended, so every beat drifted later by
the beat's own time: against a slow Redis beats came further apart than the period, and the
record, rewritten `period + beat` after the last, lapsed under a TTL the slack of which
(`beat_timeout_s`) was sized for the period alone. Beats are due on a fixed cadence now: a
period after the last was due, one overdue at once, those missed skipped rather than sent in a
burst. Times here are a clock the test sets: nothing waits on the wall clock."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest
import redis

from shared.keys import Keys
from shared.settings import Settings
from tests.conftest import REPO_ROOT, until
from workers.runtime.consumer_runtime import consumer_name
from workers.runtime.heartbeat import Cadence, _Beater

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"
# A period no test waits out: a beater that waits one after a beat sends no second beat here.
PERIOD_S = 3_600.0


def _reads(*times: float) -> Callable[[], float]:
    """A clock that reads `times` in turn."""
    return iter(times).__next__


def test_a_beat_is_due_a_period_after_the_last_was_due_not_after_it_ended() -> None:
    cadence = Cadence(2.0, _reads(100.0, 100.5, 102.5))
    assert cadence.pause_s() == 1.5  # the beat took 0.5 s of its 2 s period
    assert cadence.pause_s() == 1.5  # due at 104, not 104.5


def test_an_overdue_beat_goes_at_once_and_the_missed_ones_are_skipped() -> None:
    cadence = Cadence(2.0, _reads(100.0, 107.0, 107.5))
    assert cadence.pause_s() == 0.0  # due at 102, 104 and 106: one beat now, not three
    assert cadence.pause_s() == 1.5  # then a period after it: 109


def test_a_failed_beat_is_retried_sooner_than_the_next_is_due() -> None:
    cadence = Cadence(2.0, _reads(100.0, 100.5, 100.9))
    assert cadence.pause_s(retry_s=0.3) == pytest.approx(0.3)  # at 100.8, before 102
    assert cadence.pause_s() == pytest.approx(1.9)  # a period after the retry was due: 102.8


@pytest.fixture
def slow_beater(redis_url: str) -> Iterator[_Beater]:
    """A beater on the fixtures' `tiny` whose every beat lasts a period on its clock, as a beat
    against a Redis slow to answer does (not started)."""
    settings = Settings(
        redis_url=redis_url,
        model_repository=FIXTURES,
        models=["tiny"],
        worker_heartbeat_s=PERIOD_S,
        worker_heartbeat_ttl_s=2 * int(PERIOD_S),
    )
    beater = _Beater(object(), settings, monotonic=itertools.count(0.0, PERIOD_S).__next__)
    yield beater
    beater.stop()


def test_a_beat_that_lasted_its_period_is_followed_at_once(
    slow_beater: _Beater, redis_client: redis.Redis
) -> None:
    """Drifting, the second beat waited a period more (an hour here) after the first ended."""
    key = Keys().worker(consumer_name())
    slow_beater.start()
    for _ in range(2):  # a beat written after each delete: the beats go on back to back
        until(lambda: redis_client.exists(key), timeout=30, every=0.01)
        redis_client.delete(key)

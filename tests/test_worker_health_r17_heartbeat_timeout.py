"""The heartbeat's Redis client never blocks, yet its socket timeout had the worker's blocking
read time (CONVEYOR_BLOCK_MS) on top of CONVEYOR_REDIS_TIMEOUT_S: against a frozen Redis, or a
connection gone silent, one beat hung that much longer before the next was sent, and a long
block time held the beats past their TTL, the live worker dropped from the registry."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterator

import pytest
import redis

from shared.keys import Keys
from shared.settings import Settings
from shared.worker_registry import TTL_S
from tests.conftest import REPO_ROOT, own_valkey, until
from workers.partition import redis_backoff
from workers.runtime.consumer_runtime import consumer_name
from workers.runtime.heartbeat import _Beater

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"
DEFAULT_PERIOD_S: float = Settings.model_fields["worker_heartbeat_s"].default


@pytest.fixture
def own_redis_url() -> Iterator[str]:
    """A server of the test's own, to freeze (the session's serves other tests)."""
    with own_valkey() as url:
        yield url


def test_a_frozen_redis_fails_a_beat_in_the_redis_timeout_not_the_block_time(
    own_redis_url: str,
    settings_env: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A block time far past the TTL: a beat that waited it out would miss the TTL."""
    settings_env(CONVEYOR_REDIS_TIMEOUT_S="0.2", CONVEYOR_BLOCK_MS="60000")
    caplog.set_level(logging.WARNING, logger=redis_backoff.__name__)
    settings = Settings(
        redis_url=own_redis_url,
        model_repository=FIXTURES,
        models=["tiny"],
        worker_heartbeat_s=0.02,
    )
    beater = _Beater(object(), settings)
    with redis.Redis.from_url(own_redis_url) as client:
        pid = int(client.info("server")["process_id"])
        beater.start()
        until(lambda: client.exists(Keys().worker(consumer_name())), timeout=5, every=0.01)
    os.kill(pid, signal.SIGSTOP)
    try:
        # a beat fails in time for the next to keep the worker's hash, were Redis back
        until(lambda: "heartbeat: redis unavailable" in caplog.text, TTL_S - DEFAULT_PERIOD_S, 0.01)
    finally:
        os.kill(pid, signal.SIGCONT)
        beater.stop()

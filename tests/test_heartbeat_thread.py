"""The heartbeat's thread is a daemon and starts no other: a worker whose start fails is one
Celery never stops (it stops no step of a worker that did not fully start), so the beat runs on
to the interpreter's exit, which must not wait for it. Its wait between beats ran on asyncio's
default executor, whose threads the exit joins (daemons too), and each such worker took up to a
beat (2 s) more to exit."""

from __future__ import annotations

import threading

import redis

from shared.keys import Keys
from shared.settings import Settings
from tests.conftest import REPO_ROOT, until
from workers.partition.redis_backoff import PAUSES
from workers.runtime.consumer_runtime import consumer_name
from workers.runtime.heartbeat import _Beater

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"


def test_the_beat_holds_no_thread_the_exit_waits_for(redis_url: str) -> None:
    settings = Settings(
        redis_url=redis_url, model_repository=FIXTURES, models=["tiny"], worker_heartbeat_s=0.2
    )
    PAUSES.start()  # the process's pause watch, a daemon the first outage log starts, once
    before = set(threading.enumerate())
    beater = _Beater(object(), settings)
    beater.start()
    try:
        heartbeat = Keys().worker(consumer_name())
        with redis.Redis.from_url(redis_url) as client:
            until(lambda: client.exists(heartbeat))
            client.delete(heartbeat)
            until(lambda: client.exists(heartbeat))  # the next beat: a wait between them done
        started = set(threading.enumerate()) - before
        # a daemon, and no executor thread: the exit joins those, daemons or not
        assert [(t.name, t.daemon) for t in started] == [("conveyor-heartbeat", True)], started
    finally:
        beater.stop()

"""A webhook's retry window and a worker's first beat on Redis's clock (shared/redis_clock.py).
The window's start was stamped on the dispatching host's clock (a producer's, a worker's) and
its end judged on the webhook worker's: a skew between them shortened or lengthened
CONVEYOR_WEBHOOK_RETRY_FOR_S by as much. A worker's heartbeat published its first beat before
it first measured the skew: that beat read the raw host clock. On a real Valkey, a skewed host
simulated as tests/test_clock_r38_sweep.py does."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis

from shared.keys import Keys
from shared.settings import Settings
from shared.webhook_events import WebhookDispatcher, event
from tests.conftest import REPO_ROOT, until
from tests.test_clock_r38_sweep import NEAR_S, SKEW_S, _host_off, _read_off, _redis_s
from tests.test_webhook_owed_edges_canary import _deliveries
from workers.runtime.consumer_runtime import consumer_name
from workers.runtime.heartbeat import _Beater
from workers.webhook_delivery import after_attempt

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"


async def test_a_webhook_worker_behind_redis_ends_the_retry_window_on_time(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt was made 55 s ago on Redis's clock; a 503 asks 10 s more, past a 60 s
    window. A worker 30 s behind read 25 s gone and retried, 30 s past the window."""
    settings = Settings(webhook_retry_for_s=60)
    first_attempt_at = await _redis_s(aredis) - 55
    await _host_off(aredis, monkeypatch, -SKEW_S)
    attempt = {"error": "HTTP 503", "status_code": 503, "retry_after_s": 10.0}
    assert after_attempt(1, attempt, first_attempt_at, settings)[0] == "failed"


async def test_a_dispatcher_off_redis_stamps_the_first_attempt_on_redis_clock(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery handed to the broker (this session's Valkey, where no worker takes it)."""
    await _host_off(aredis, monkeypatch, SKEW_S)  # the producer's host, ahead
    body = event("job.succeeded", "t", {"id": "j"})
    WebhookDispatcher(redis_url).send("job", "j", "https://example.com/hooks", body)
    [delivery] = await _deliveries(aredis)
    assert abs(delivery["first_attempt_at"] - await _redis_s(aredis)) < NEAR_S


def test_a_workers_first_beat_is_on_redis_clock(
    redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A beat a minute apart: only the first is read, measured before it is published."""
    _read_off(monkeypatch, -SKEW_S)  # the worker's host, no skew measured yet
    settings = Settings(
        redis_url=redis_url,
        model_repository=FIXTURES,
        models=["tiny"],
        worker_heartbeat_s=60,
        worker_heartbeat_ttl_s=120,
    )
    beater = _Beater(object(), settings)
    beater.start()
    try:
        key = Keys().worker(consumer_name())
        last_beat = float(until(lambda: redis_client.hget(key, "last_beat"), timeout=30))
        seconds, micros = redis_client.time()  # type: ignore[misc]
        assert abs(last_beat - (int(seconds) + int(micros) / 1e6)) < NEAR_S
    finally:
        beater.stop()

"""The last raw host clocks at start-up: a producer served its first requests before its
`redis-clock` loop first measured (their stamps on the raw host clock), a worker's `started_at`
sat on its host clock beside a `last_beat` on Redis's (a console's uptime a skew off), and an
event with no `created` of its own (a canary's) was stamped on the host clock while a job's
event carries its job's `finished`, on Redis's. On a real Valkey; a skewed host is this
process's `time` read off (tests/test_clock_r38_sweep.py)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.canary.controller import owed_webhook
from shared.canary_store import Canary
from shared.job_store import now_ms
from shared.keys import Keys
from shared.settings import Settings
from shared.worker_registry import Heartbeat
from tests.app_client import app_client
from tests.conftest import REPO_ROOT, until_async
from tests.test_clock_r38_sweep import NEAR_S, SKEW_S, _host_off, _read_off, _redis_s
from workers.runtime.consumer_runtime import consumer_name
from workers.runtime.heartbeat import _Beater

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"


async def test_a_producer_stamps_on_redis_clock_from_its_first_request(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked before the app awaits anything: the `redis-clock` loop has not run yet."""
    _read_off(monkeypatch, -SKEW_S)  # the producer's host
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="r38-startup")
    async with app_client(create_app(settings)):
        stamp_s = now_ms() / 1000  # what a submit served now stamps its enqueue with
    assert abs(stamp_s - await _redis_s(aredis)) < NEAR_S


async def test_a_workers_start_is_stamped_on_redis_clock_as_its_beats_are(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The beater built on a host behind Redis: its uptime (`last_beat - started_at`) was
    the skew, 30 s, the moment it started."""
    _read_off(monkeypatch, -SKEW_S)  # the worker's host
    settings = Settings(
        redis_url=redis_url, model_repository=FIXTURES, models=["tiny"], worker_heartbeat_s=0.02
    )
    beater = _Beater(object(), settings)
    key = Keys().worker(consumer_name())
    try:
        beater.start()  # its own thread and loop
        await until_async(lambda: aredis.exists(key))
        beat = Heartbeat.from_fields(await aredis.hgetall(key))  # type: ignore[arg-type]
    finally:
        beater.stop()
    assert abs(beat.started_at - await _redis_s(aredis)) < NEAR_S
    assert 0 <= beat.last_beat - beat.started_at < NEAR_S


async def test_a_canary_event_is_created_on_redis_clock_as_a_jobs_is(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's event is `created` at its `finished`, on Redis's clock; a canary's, created now,
    was 30 s apart from it on a producer behind Redis."""
    await _host_off(aredis, monkeypatch, -SKEW_S)  # the producer's host
    canary = Canary("m", "v2", "v1", [50.0], 60.0, 0.01, 1000.0, 100, webhook="https://h.test/c")
    owed = owed_webhook(canary, "promoted", {"model": "m"})
    assert owed is not None
    assert abs(owed.body["created"] - await _redis_s(aredis)) < NEAR_S

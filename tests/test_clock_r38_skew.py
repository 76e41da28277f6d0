"""Job times are stamped and judged on Redis's clock (shared/redis_clock.py), whatever the hosts'
own clocks say: a worker whose clock ran 30 s ahead of its producers expired every fresh job
whose `max_queue_time_s` was 10 s, and a producer 30 s ahead stamped its jobs' enqueue and
`ttl_s` deadline 30 s late. On a real Valkey; a host clock "ahead" is this process's `time`
read 30 s fast (the server's TIME is the real one), the skew measured as the heartbeat and the
producer's `redis-clock` loop measure it."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared import redis_clock
from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig, QueueLimits
from shared.redis_clock import CLOCK, ClockSkew, adopt_redis_clock
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async
from tests.test_clock_r38_sweep import _read_off
from workers.partition.partition import Partition
from workers.partition.stream_reader import StreamReader

AHEAD_S = 30.0
NEAR_MS = 5_000  # well under the skew: a stamp this close to Redis's time is on its clock
KEYS = Keys("r38-clock:")
PARTITION = Partition.of(
    KEYS,
    ModelConfig(name="m", kind="batch", backend="identity", queue=QueueLimits(max_queue_time_s=10)),
    "default",
)


async def _redis_ms(client: aioredis.Redis) -> float:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) / 1000


async def test_a_healthy_hosts_clock_is_left_uncorrected(aredis: aioredis.Redis) -> None:
    """A skew within the measure's uncertainty and APPLY_S is no skew: no jitter per measure."""
    await adopt_redis_clock(aredis)
    assert CLOCK.skew_ns == 0


async def test_a_worker_ahead_of_redis_does_not_expire_a_fresh_job(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=redis_clock.__name__)
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry("fresh", {"inputs": {}}, now_ms(), reply="r38-clock:reply")
    await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    _read_off(monkeypatch, AHEAD_S)  # the worker's host
    await ClockSkew(every_s=0, corrects=CLOCK).check(aredis)  # the heartbeat's measure
    [warned] = caplog.records  # still told: the correction is only as good as the last measure
    assert "+30" in warned.getMessage() and "NTP" in warned.getMessage()

    reader = StreamReader(aredis, KEYS, list(PARTITION.streams), "r38-clock-worker")
    await reader.ensure_groups()
    [(_, [delivery])] = await reader.wait([PARTITION.online], 10, None)
    expired = PARTITION.skip_or_expire(delivery)
    assert expired is None, expired.fields  # waited ms, not 30 s: it runs
    assert abs(delivery.claimed_ms - await _redis_ms(aredis)) < NEAR_MS


async def test_a_producer_ahead_of_redis_stamps_its_jobs_on_redis_clock(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _read_off(monkeypatch, AHEAD_S)  # the producer's host
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="r38-clock")
    async with app_client(create_app(settings)) as client:
        await until_async(_adopted)  # the `redis-clock` loop's first measure, at start
        answer = await client.post(
            "/v1/jobs", json={"model": "identity", "inputs": {}, "ttl_s": 60}
        )
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]
    stamps = await aredis.hmget(Keys().job(job_id), ["created", "deadline"])
    created, deadline = (float(stamp or 0) for stamp in stamps)
    redis_ms = await _redis_ms(aredis)
    assert abs(created - redis_ms) < NEAR_MS
    assert abs(deadline - (redis_ms + 60_000)) < NEAR_MS


async def _adopted() -> bool:
    return abs(CLOCK.skew_ns / 1e9 - AHEAD_S) < 1.0

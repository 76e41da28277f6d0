"""Every time one host stamps and another judges is on Redis's clock (shared/redis_clock.py), not
only a job's: with a skew adopted, a host that still read its raw clock judged the others'
stamps a skew off. A webhook reclaimer 30 s behind Redis leased an overdue event for 1 ms (two
reclaimers sent it), a producer behind read the drain rate and the variant stats a window before
the seconds workers filed them in, a canary's step, stamped by the producer that took it, ran a
skew longer or shorter to the next, and a console read the oldest job's age and a worker's beat
a skew off. On a real Valkey; a skewed host is this process's `time` read off by SKEW_S (the
server's TIME is the real one), its skew measured and adopted as the heartbeat and the
producer's `redis-clock` loop do."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.canary.controller import starved
from shared import redis_clock
from shared.backlog import ServiceCost
from shared.canary_store import Canary
from shared.codec import RequestEntry
from shared.drain_rate import drain_rates
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, ModelRepository
from shared.partition_stats import read_partition_stats
from shared.redis_clock import CLOCK, adopt_redis_clock
from shared.settings import Settings
from shared.variant_stats import VariantStats
from shared.webhook_outbox import WebhookOutbox
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.app_client import app_client
from tests.conftest import until_async

SKEW_S = 30.0
NEAR_S = 5.0  # well under the skew: a time this close to Redis's is on its clock
KEYS = Keys("r38-sweep:")
LANE = KEYS.queue("m", "default")


async def _host_off(client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, off_s: float) -> None:
    """This host's clock from now on `off_s` off Redis's, and that skew measured and adopted."""
    _read_off(monkeypatch, off_s)
    await adopt_redis_clock(client)
    assert abs(CLOCK.skew_ns / 1e9 - off_s) < 1.0


# The host's own clock, as read before any test patched it: a second `_read_off` in a test (two
# producers' clocks in turn) sets the clock `off_s` off the true one, not off the last fake.
_REAL_S, _REAL_NS = time.time, time.time_ns


def _read_off(monkeypatch: pytest.MonkeyPatch, off_s: float) -> None:
    """This host's clock `off_s` off Redis's as everything here reads it: `time.time` (a skew's
    measure) and `time.time_ns` (CLOCK's stamps, `now_ms`)."""
    monkeypatch.setattr(time, "time", lambda: _REAL_S() + off_s)
    monkeypatch.setattr(time, "time_ns", lambda: _REAL_NS() + int(off_s * 1e9))


async def _redis_s(client: aioredis.Redis) -> float:
    seconds, micros = await client.time()
    return int(seconds) + int(micros) / 1e6


async def test_a_reclaimer_behind_redis_leases_an_overdue_webhook_for_the_timeout(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    idle_ms = 20_000  # the reclaimer's visibility timeout
    await _host_off(aredis, monkeypatch, -SKEW_S)
    await aredis.zadd(KEYS.webhooks_owed("lane-a"), {"job-1": now_ms() - 60_000})
    holder, other = WebhookOutbox(aredis, KEYS), WebhookOutbox(aredis, KEYS)
    assert await holder.overdue("lane-a", now_ms() - idle_ms, 10) == ["job-1"]
    await asyncio.sleep(0.01)  # past a 1 ms lease
    assert await other.overdue("lane-a", now_ms() - idle_ms, 10) == []  # held: sent once


async def test_a_producer_behind_redis_reads_the_drain_rate_workers_filed(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = int(await _redis_s(aredis))
    for at in range(second - 5, second + 1):  # as the workers' FINISH files them
        await aredis.set(KEYS.drained(LANE, at), 10)
    await _host_off(aredis, monkeypatch, -SKEW_S)
    [rate] = await drain_rates(aredis, KEYS, [LANE], 10)
    assert rate > 1.0  # 60 over the window, not the empty seconds a skew before


async def test_a_producer_behind_redis_reads_the_variant_stats_workers_filed(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await VariantStats(aredis, Keys()).add_counts("identity", "default", {"requests": 3})
    _read_off(monkeypatch, -SKEW_S)  # the producer's host
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="r38-sweep")
    async with app_client(create_app(settings)) as client:
        await until_async(lambda: _adopted(-SKEW_S))  # the `redis-clock` loop's first measure
        answer = await client.get("/v1/experiments/identity", params={"window_s": 20})
    assert answer.status_code == 200, answer.text
    [variant] = [v for v in answer.json()["variants"] if v["variant"] == "default"]
    assert variant["requests"] >= 3, variant  # the bucket filed now on Redis's clock is read


async def test_a_worker_behind_redis_files_its_variant_stats_on_redis_clock(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis_s = await _redis_s(aredis)
    await _host_off(aredis, monkeypatch, -SKEW_S)  # the worker's host
    stats = VariantStats(aredis, KEYS)
    await stats.add_counts("m", "default", {"requests": 3})
    window = await stats.window("m", ["default"], redis_s - 5, redis_s + 1, samples=False)
    assert window["default"].requests == 3  # in the bucket of now, not three buckets back


async def test_a_producer_off_redis_warns_of_it_as_a_worker_does(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The app logs its JSON lines to stderr, its own handler in place of pytest's."""
    _read_off(monkeypatch, SKEW_S)
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="r38-sweep")
    async with app_client(create_app(settings)):
        await until_async(lambda: _adopted(SKEW_S))
    warned = [line for line in capsys.readouterr().err.splitlines() if redis_clock.__name__ in line]
    assert any("+30" in said and "NTP" in said for said in warned), warned


async def test_a_canary_step_taken_on_another_host_is_timed_on_redis_clock(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step began 140 s ago on Redis's clock (the producer that held the lease then stamped
    it); this producer, 30 s behind, read 110 s and let a starved step run on."""
    began = await _redis_s(aredis) - 140
    await _host_off(aredis, monkeypatch, -SKEW_S)
    canary = Canary(
        model="m",
        variant="v2",
        baseline="v1",
        steps=[10.0, 100.0],
        interval_s=60.0,
        max_error_rate=0.01,
        max_p99_ms=1000.0,
        min_requests=100,
        step_started_at=began,
        max_step_s=120.0,
    )
    reason = starved(canary, "3 requests", "do its workers take jobs?")
    assert reason is not None and "max_step_s 120" in reason


async def test_the_oldest_jobs_age_is_read_on_redis_clock(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _host_off(aredis, monkeypatch, SKEW_S)  # the console's producer, ahead
    await aredis.xgroup_create(LANE, GROUP, "0", mkstream=True)
    entry = RequestEntry("fresh", {"inputs": {}}, now_ms(), reply="r38-sweep:reply")
    await JobStore(aredis, KEYS, ttl_s=60).create(entry, LANE, {"model": "m", "variant": "default"})
    repository = ModelRepository({"m": ModelConfig(name="m", kind="batch", backend="identity")})
    [stats] = await read_partition_stats(aredis, KEYS, repository)
    assert stats.online.oldest_age_s < NEAR_S  # just submitted, not 30 s waiting


async def test_a_workers_beat_is_stamped_on_redis_clock(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console shows "last beat N s ago" from a worker's stamp against its own clock."""
    await _host_off(aredis, monkeypatch, -SKEW_S)  # the worker's host
    beat = Heartbeat("r38-w", "host", 1, "serving", models=["m:default"])
    await WorkerRegistry(aredis, KEYS).publish(beat, {("m", "default"): ServiceCost(0.01)})
    assert abs(beat.last_beat - await _redis_s(aredis)) < NEAR_S


async def _adopted(off_s: float) -> bool:
    return abs(CLOCK.skew_ns / 1e9 - off_s) < 1.0

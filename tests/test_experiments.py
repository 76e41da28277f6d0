"""Experiment statistics match a hand computation: a fixed fixture of finished jobs and shadow
comparisons is recorded through the same Redis counters workers and producers write, and
`GET /v1/experiments/{model}` (the producer app in-process, on a real Redis) reports the
percentiles, success rates, shadow agreement, z-test and Mann-Whitney U computed here by hand."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.experiments import serving as experiments_serving
from producer_api.experiments.statistics import percentiles, summary, versus
from shared.keys import Keys
from shared.settings import Settings
from shared.shadow_compare import Comparison
from shared.stats_window import BUCKET_S
from shared.variant_stats import Sample, VariantStats, Window
from tests.app_client import app_client
from tests.conftest import REPO_ROOT
from workers.partition.finished_stats import FinishedStats

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"

# stable: 200 jobs, the last 10 failed; candidate: 100 jobs, the last 20 failed (milliseconds, as
# job hashes stamp them). Service times never tie across the two (even against odd), so
# Mann-Whitney needs no tie correction.
STABLE = [(2 + i % 7, 10 + 2 * i, i < 190) for i in range(200)]
CANDIDATE = [(3 + j % 5, 5 + 2 * j, j < 80) for j in range(100)]
COMPARISONS = [Comparison(i < 8, 1.0 if i < 8 else 0.5, 2.0, 0) for i in range(10)]


def _job(variant: str, queue_ms: int, service_ms: int, ok: bool) -> dict[str, str]:
    """A finished job's hash fields, as the worker's write-back leaves them."""
    created = 1_700_000_000_000
    return {
        "model": "ab",
        "variant": variant,
        "status": "succeeded" if ok else "failed",
        "created": str(created),
        "started": str(created + queue_ms),
        "finished": str(created + queue_ms + service_ms),
    }


def _percentile(values: list[int], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), by hand."""
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _normal_two_sided(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2))


@pytest.fixture
async def api(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    stats = VariantStats(aredis, Keys())
    recorder = FinishedStats(stats)  # what a worker's write-back records finished jobs through
    recorder.add(_job("stable", *row) for row in STABLE)
    recorder.add(_job("candidate", *row) for row in CANDIDATE)
    await recorder.close()
    for comparison in COMPARISONS:
        await stats.add_counts("ab", "mirror", comparison.counts())
    settings = Settings(
        redis_url=redis_url, model_repository=TRAFFIC, auth="disabled", instance_id="experiments"
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def test_statistics_match_a_hand_computation(api: httpx.AsyncClient) -> None:
    before = time.time()
    response = await api.get("/v1/experiments/ab", params={"window_s": 600})
    after = time.time()
    assert response.status_code == 200, response.text
    report = response.json()
    # the span measured: whole buckets, so from the start of the one 600 s ago (it echoed 600)
    span = report["window_s"]
    assert 600 < span < 600 + BUCKET_S
    assert math.floor((after - span) / BUCKET_S) * BUCKET_S >= before - span - 1e-3
    assert report["baseline"] == "stable"
    by_name = {v["variant"]: v for v in report["variants"]}
    assert set(by_name) == {"stable", "candidate", "flaky", "mirror"}

    stable, candidate = by_name["stable"], by_name["candidate"]
    assert (stable["requests"], stable["failed"], stable["success_rate"]) == (200, 10, 0.95)
    assert (candidate["requests"], candidate["failed"], candidate["success_rate"]) == (100, 20, 0.8)
    for row, rows in ((stable, STABLE), (candidate, CANDIDATE)):
        for kind, values in (
            ("queue", [q for q, _, _ in rows]),
            ("service", [s for _, s, _ in rows]),
            ("total", [q + s for q, s, _ in rows]),
        ):
            for p in (50, 95, 99):
                got = row["latency_ms"][kind][f"p{p}"]
                assert got == pytest.approx(_percentile(values, p), abs=1e-3), (kind, p)

    pooled = (190 + 80) / 300
    z = (80 / 100 - 190 / 200) / math.sqrt(pooled * (1 - pooled) * (1 / 200 + 1 / 100))
    versus = candidate["vs_baseline"]
    assert versus["success_rate_z"] == pytest.approx(z, abs=1e-6)
    assert versus["success_rate_p"] == pytest.approx(_normal_two_sided(z), rel=1e-9)

    mine, theirs = [s for _, s, _ in CANDIDATE], [s for _, s, _ in STABLE]
    u = sum(1.0 for x in mine for y in theirs if x > y)
    mu = len(mine) * len(theirs) / 2
    sigma = math.sqrt(len(mine) * len(theirs) * (len(mine) + len(theirs) + 1) / 12)
    assert versus["latency_u"] == u
    p_latency = _normal_two_sided((abs(u - mu) - 0.5) / sigma)
    assert versus["latency_p"] == pytest.approx(p_latency, rel=1e-9)
    assert "success rate 80.0% is significantly lower than stable's 95.0%" in versus["verdict"]
    assert "significantly faster than stable" in versus["verdict"]
    assert stable["vs_baseline"] is None
    assert by_name["flaky"]["vs_baseline"]["status"] == "insufficient_data"

    mirror = by_name["mirror"]
    assert mirror["role"] == "shadow" and mirror["shadow_rate"] == 1.0
    assert mirror["shadow"] == {
        "pairs": 10,
        "answered_pairs": 10,
        "agreement": 0.8,
        "mean_similarity": 0.9,
        "mean_latency_delta_ms": 2.0,
        "shadow_only_failed": 0,
        "primary_only_failed": 0,
        "both_failed": 0,
    }


async def test_the_tests_run_off_the_event_loop(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first comparison imports scipy.stats (about a second on 2 cores, kept out of the
    producer's start): run on the event loop, it held every other request of the producer."""
    threads: list[threading.Thread] = []

    def seen(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return versus(*args)

    monkeypatch.setattr(experiments_serving, "versus", seen)
    response = await api.get("/v1/experiments/ab", params={"window_s": 600})
    assert response.status_code == 200, response.text
    assert threads and threading.main_thread() not in threads  # the loop's thread


async def test_unknown_model_or_baseline_is_a_4xx(api: httpx.AsyncClient) -> None:
    assert (await api.get("/v1/experiments/nope")).status_code == 404
    response = await api.get("/v1/experiments/ab", params={"baseline": "nope"})
    assert response.status_code == 422 and "no variant 'nope'" in response.text
    negative = await api.get("/v1/experiments/ab", params={"window_s": -1})
    assert negative.status_code == 422


def _window(service_ms: list[int]) -> Window:
    window = Window(samples=[Sample(True, 1.0, float(ms)) for ms in service_ms])
    window.counters["requests"] = len(service_ms)
    return window


def test_a_faster_variant_with_the_same_median_is_called_faster() -> None:
    """The direction came from the medians, so equal ones (common with whole-ms service times)
    read "slower" even for a significantly faster variant; it comes from U now."""
    baseline = _window([12] * 100 + [14] * 200 + [16] * 100 + [30] * 100)
    candidate = _window([10] * 150 + [14] * 200 + [15] * 100 + [16] * 50)
    report = versus("stable", baseline, candidate)
    assert report is not None and report["latency_p"] < 1e-10
    assert "significantly faster than stable (median service 14.0 vs 14.0 ms" in report["verdict"]
    # by how much, where the medians cannot say: the candidate's time is the shorter in 65 % of
    # (candidate, baseline) pairs, ties counted half (counted pair by pair: 0.65)
    assert "shorter in 65% of pairs" in report["verdict"]
    slower = versus("stable", candidate, baseline)
    assert slower is not None and "significantly slower than stable" in slower["verdict"]
    assert "longer in 65% of pairs" in slower["verdict"]


def test_bulk_lane_waits_leave_the_queue_and_total_percentiles_alone() -> None:
    """A Batch API item waits in the bulk lane behind online work by design: a few 60 s waits
    moved the experiment's p99 (the canary's had stopped counting them); they still count as
    requests and errors, and their service time (claim → result) is the variant's."""
    online = [Sample(i % 10 != 0, 5.0 + i % 7, 20.0 + i % 11) for i in range(200)]
    bulk = [Sample(False, 60_000.0, 25.0, bulk=True) for _ in range(5)]
    alone, mixed = Window(samples=online), Window(samples=[*online, *bulk])
    for window in (alone, mixed):
        window.counters["requests"] = len(window.samples)
        window.counters["errors"] = sum(1 for s in window.samples if not s.ok)
    report, expected = summary(mixed), summary(alone)
    assert (report["requests"], report["failed"]) == (205, 25)
    for kind in ("queue", "total"):
        assert report["latency_ms"][kind] == expected["latency_ms"][kind], kind
    assert report["latency_ms"]["service"] == percentiles([s.service_ms for s in mixed.samples])


def _outcomes(requests: int, errors: int) -> Window:
    window = Window()
    window.counters["requests"], window.counters["errors"] = requests, errors
    return window


def test_a_few_requests_are_tested_exactly_not_with_z() -> None:
    """The z-test called 0 of 1 against 15 of 15 "significantly lower" (p≈6e-5): its normal
    approximation needs every expected count at 5 or more; below, Fisher's exact test decides
    (p = 1/16 here). Large samples keep the z-test."""
    few = versus("stable", _outcomes(15, 0), _outcomes(1, 1))
    assert few is not None and few["success_rate_test"] == "fisher"
    assert few["success_rate_p"] == pytest.approx(1 / 16) and few["success_rate_p"] > 0.05
    assert few["verdict"].startswith("not enough data yet") and "significant" not in few["verdict"]
    many = versus("stable", _outcomes(200, 10), _outcomes(100, 20))
    assert many is not None and many["success_rate_test"] == "z"
    assert many["success_rate_p"] < 0.05 and "significantly lower" in many["verdict"]

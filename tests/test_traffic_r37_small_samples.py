"""Experiment statistics at the small samples `?min_samples=` lets through. Mann-Whitney was
scipy's asymptotic test at any size: against an arm of one sample, with whole-ms (tied) service
times, its tie-corrected variance neared 0 and p read 1e-45, where no test of a lone sample goes
below 1/(n + 1). The latency test now waits for SMALL_ARM timed samples on each arm, whatever
`?min_samples=`. And an arm with no request had a null `vs_baseline`, not the
`insufficient_data` README promises "until both have" min_samples."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis
from scipy import stats

from producer_api.app import create_app
from producer_api.experiments.protocol import ExperimentReport
from producer_api.experiments.statistics import SMALL_ARM, versus
from shared.keys import Keys
from shared.settings import Settings
from shared.variant_stats import Sample, VariantStats, Window
from tests.app_client import app_client
from tests.test_experiments import TRAFFIC, _job
from workers.partition.finished_stats import FinishedStats


def _window(service_ms: list[float]) -> Window:
    """A variant's window of succeeded online jobs with these service times."""
    window = Window()
    window.counters["requests"] = len(service_ms)
    window.samples = [Sample(True, 1.0, ms) for ms in service_ms]
    return window


@pytest.fixture
async def api(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """Model `ab`: one stable job of 3 ms, 200 candidate jobs of 2 ms, nothing on flaky."""
    recorder = FinishedStats(VariantStats(aredis, Keys()))  # a worker's, as its write-back's
    recorder.add([_job("stable", 1, 3, True)])
    recorder.add(_job("candidate", 1, 2, True) for _ in range(200))
    await recorder.close()
    settings = Settings(
        redis_url=redis_url, model_repository=TRAFFIC, auth="disabled", instance_id="r37-small"
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def test_one_baseline_sample_is_no_latency_evidence(api: httpx.AsyncClient) -> None:
    response = await api.get("/v1/experiments/ab", params={"min_samples": 1})

    assert response.status_code == 200, response.text
    ExperimentReport.model_validate(response.json())
    variants = {v["variant"]: v for v in response.json()["variants"]}
    candidate = variants["candidate"]["vs_baseline"]
    assert candidate["status"] == "ok", candidate
    # the lone stable job is the slowest of 201: 1 chance in 201 under the null, no less; the
    # asymptotic test read 1e-45 and called it significant
    assert (candidate["latency_u"], candidate["latency_p"]) == (None, None), candidate
    assert f"{SMALL_ARM} per arm" in candidate["verdict"], candidate["verdict"]


async def test_an_arm_with_no_request_is_insufficient_data(api: httpx.AsyncClient) -> None:
    response = await api.get("/v1/experiments/ab", params={"min_samples": 1})

    flaky = {v["variant"]: v for v in response.json()["variants"]}["flaky"]["vs_baseline"]
    assert flaky is not None
    assert flaky["status"] == "insufficient_data"
    assert flaky["samples_needed"] == {"baseline": 0, "variant": 1}
    assert flaky["verdict"] == (
        "not enough data yet: 1 more on this variant (at least 1 request per arm)"
    )
    assert (flaky["success_rate_test"], flaky["success_rate_p"], flaky["latency_p"]) == (
        None,
        None,
        None,
    )


def test_the_latency_test_runs_once_each_arm_has_the_fewest_samples_it_holds_at() -> None:
    """At SMALL_ARM timed samples on each arm, whatever `min_samples`, and not one before."""
    variant = [float(ms) for ms in range(200)]
    short, enough = _window([500.0] * (SMALL_ARM - 1)), _window([500.0] * SMALL_ARM)

    assert versus("stable", short, _window(variant), min_samples=1)["latency_p"] is None
    report = versus("stable", enough, _window(variant), min_samples=1)

    expected = stats.mannwhitneyu(variant, [500.0] * SMALL_ARM, method="asymptotic").pvalue
    assert report["latency_p"] == pytest.approx(expected)
    assert "significantly faster than stable" in report["verdict"], report["verdict"]

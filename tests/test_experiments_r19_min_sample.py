"""An experiment gives no verdict before each arm has a minimum sample: "no significant
difference (p=1)" at one request per arm is correct but reads as evidence. Below MIN_SAMPLES
requests on either arm the verdict says how many more each arm needs (`samples_needed`); the
success-rate test is still reported (Fisher's exact test is valid at any size), the latency
test only once both arms have the minimum of timed samples. `?min_samples=` tunes it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.experiments.protocol import ExperimentReport
from producer_api.experiments.statistics import MIN_SAMPLES, versus
from shared.keys import Keys
from shared.settings import Settings
from shared.variant_stats import Sample, VariantStats, Window
from tests.app_client import app_client
from tests.test_experiments import TRAFFIC, _job
from workers.partition.finished_stats import FinishedStats


def _arm(requests: int, errors: int = 0, timed: int | None = None) -> Window:
    """`requests` finished jobs, the first `errors` failed, `timed` of them with a service time
    (all unless said: an expired job keeps none)."""
    timed = requests if timed is None else timed
    window = Window(samples=[Sample(i >= errors, 1.0, 10.0 + i % 7) for i in range(timed)])
    window.counters["requests"], window.counters["errors"] = requests, errors
    return window


def test_one_request_per_arm_is_not_enough_data() -> None:
    report = versus("stable", _arm(1), _arm(1))
    assert report is not None
    assert report["status"] == "insufficient_data"
    assert report["samples_needed"] == {"baseline": MIN_SAMPLES - 1, "variant": MIN_SAMPLES - 1}
    assert "no significant difference" not in report["verdict"]
    assert report["verdict"].startswith("not enough data yet")
    assert report["verdict"] == (
        f"not enough data yet: {MIN_SAMPLES - 1} more on this variant and {MIN_SAMPLES - 1} more"
        f" on stable (at least {MIN_SAMPLES} requests per arm)"
    )
    # the success-rate test stays a valid one (Fisher's, p = 1); no latency test on 1 vs 1
    assert (report["success_rate_test"], report["success_rate_p"]) == ("fisher", 1.0)
    assert report["latency_u"] is None and report["latency_p"] is None


def test_only_the_short_arm_needs_more() -> None:
    report = versus("stable", _arm(5 * MIN_SAMPLES), _arm(MIN_SAMPLES - 10))
    assert report is not None and report["status"] == "insufficient_data"
    assert report["samples_needed"] == {"baseline": 0, "variant": 10}
    assert report["verdict"] == (
        f"not enough data yet: 10 more on this variant (at least {MIN_SAMPLES} requests per arm)"
    )
    enough = versus("stable", _arm(MIN_SAMPLES), _arm(MIN_SAMPLES, errors=MIN_SAMPLES // 2))
    assert enough is not None and enough["status"] == "ok"
    assert enough["samples_needed"] == {"baseline": 0, "variant": 0}
    assert "significantly lower" in enough["verdict"]
    assert enough["latency_p"] is not None


def test_too_few_timed_samples_skip_the_latency_test_but_not_the_success_verdict() -> None:
    """Expired jobs count as requests (and errors) but keep no service time: the rank test on
    a handful of timed samples would be the same small-sample guess."""
    expired = _arm(MIN_SAMPLES, errors=MIN_SAMPLES - 3, timed=3)
    report = versus("stable", _arm(MIN_SAMPLES), expired)
    assert report is not None and report["status"] == "ok"
    assert "significantly lower" in report["verdict"]
    assert report["latency_u"] is None and report["latency_p"] is None
    assert f"too few timed samples to test (3 vs {MIN_SAMPLES}" in report["verdict"]


def test_identical_arms_with_no_variance_read_no_difference() -> None:
    """All successes and one service time on both arms: the z-test's standard error and the
    rank test's tie-corrected variance are 0; both give p = 1 (never NaN, which would read as
    significant and is no JSON number)."""
    same = Window(samples=[Sample(True, 1.0, 10.0)] * MIN_SAMPLES)
    same.counters["requests"] = MIN_SAMPLES
    report = versus("stable", same, same)
    assert report is not None and report["status"] == "ok"
    assert (report["success_rate_p"], report["latency_p"]) == (1.0, 1.0)
    assert report["verdict"].count("no significant difference") == 2


@pytest.fixture
async def api(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """Model `ab` with 120 finished jobs on stable and 40 on candidate."""
    recorder = FinishedStats(VariantStats(aredis, Keys()))  # a worker's, as its write-back's
    recorder.add(_job("stable", 2, 10 + i % 9, True) for i in range(120))
    recorder.add(_job("candidate", 3, 11 + i % 5, True) for i in range(40))
    await recorder.close()
    settings = Settings(
        redis_url=redis_url, model_repository=TRAFFIC, auth="disabled", instance_id="r19"
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def test_min_samples_is_a_query_parameter_echoed_in_the_report(
    api: httpx.AsyncClient,
) -> None:
    default = (await api.get("/v1/experiments/ab")).json()
    ExperimentReport.model_validate(default)  # the documented body, new fields and all
    assert default["min_samples"] == MIN_SAMPLES
    candidate = {v["variant"]: v for v in default["variants"]}["candidate"]["vs_baseline"]
    assert candidate["samples_needed"] == {"baseline": 0, "variant": MIN_SAMPLES - 40}

    response = await api.get("/v1/experiments/ab", params={"min_samples": 30})
    assert response.status_code == 200, response.text
    tuned = response.json()
    assert tuned["min_samples"] == 30
    candidate = {v["variant"]: v for v in tuned["variants"]}["candidate"]["vs_baseline"]
    assert candidate["status"] == "ok" and candidate["latency_p"] is not None
    bad = await api.get("/v1/experiments/ab", params={"min_samples": 0})
    assert bad.status_code == 422

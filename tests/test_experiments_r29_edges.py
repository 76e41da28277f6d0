"""Experiment edges an operator comparing variants meets at scale: a `?min_samples=` above what
a window reads (WINDOW_SAMPLES samples per arm) still lets the latency test run, and two success
rates that differ significantly are never printed as the same percentage."""

from __future__ import annotations

from producer_api.experiments.statistics import versus
from shared.stats_window import WINDOW_SAMPLES
from tests.test_experiments_r19_min_sample import _arm


def test_a_min_samples_above_the_window_cap_still_tests_latency() -> None:
    """200 000 requests per arm with ?min_samples=200000: both arms have the minimum, and each
    window holds all the samples a window ever holds; the rank test runs on them (it said "too
    few timed samples to test (100000 vs 100000, at least 200000 per arm)" for ever)."""
    requests = 2 * WINDOW_SAMPLES
    arm = _arm(requests, timed=WINDOW_SAMPLES)
    report = versus("stable", arm, arm, min_samples=requests)
    assert report is not None and report["status"] == "ok"
    assert (report["latency_u"], report["latency_p"]) == (WINDOW_SAMPLES**2 / 2, 1.0)
    assert "too few timed samples" not in report["verdict"]
    assert "median service 13.0 ms vs 13.0 ms: no significant difference" in report["verdict"]


def test_significantly_different_success_rates_read_different() -> None:
    """99.99 % against 99.96 % over a million requests each is significant; at one decimal both
    read 100.0 % ("100.0% is significantly higher than stable's 100.0%")."""
    report = versus("stable", _arm(1_000_000, 400, timed=0), _arm(1_000_000, 100, timed=0))
    assert report is not None and report["success_rate_p"] < 1e-9
    assert report["verdict"].startswith(
        "success rate 99.99% is significantly higher than stable's 99.96%"
    )
    same = versus("stable", _arm(1000, 1, timed=0), _arm(1000, 1, timed=0))
    assert same is not None
    assert same["verdict"].startswith("success rate 99.9% vs 99.9%: no significant difference")

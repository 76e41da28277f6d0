"""Experiment statistics from per-variant windows (shared/variant_stats): latency percentiles,
success rates, shadow agreement, and tests against the baseline — a two-proportion z-test on
success rates (Fisher's exact test when an expected count is under MIN_EXPECTED, where the
normal approximation fails) and Mann-Whitney U (scipy, asymptotic with continuity correction) on
service times, once each arm has SMALL_ARM of them — with a verdict in plain words at ALPHA,
once each arm has a minimum sample."""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from shared.shadow_compare import FAILED
from shared.stats_window import WINDOW_SAMPLES
from shared.variant_stats import Window

# scipy.stats is imported where a test runs, not with the module: it is a third of the
# producer's import time (about 1 of 3 s on 2 cores), paid at every start, and most producers
# never compare variants.

ALPHA = 0.05
MIN_EXPECTED = 5.0  # the usual validity rule of the z-test's normal approximation
PERCENTILES = (50, 95, 99)
# Requests per arm (and timed samples, for the latency test) before a verdict: below, "no
# significant difference (p=1)" is true of one request per arm and reads as evidence, so the
# verdict says how many more each arm needs instead. 100 keeps the rank test's normal
# approximation sound and lets a few points of success rate show; `?min_samples=` tunes it.
MIN_SAMPLES = 100
# The fewest timed samples per arm the latency test runs on, whatever `?min_samples=`: below
# it scipy's normal approximation fails (its notes: exact under 8 samples, and with many ties
# the tie-corrected variance nears 0), and one whole-ms sample against 1,000 read p = 1e-110,
# where no test of a lone sample can go below 1/1,001.
SMALL_ARM = 10


def percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    points = np.percentile(values, PERCENTILES)
    return {f"p{p}": round(float(v), 3) for p, v in zip(PERCENTILES, points, strict=True)}


def summary(window: Window) -> dict[str, Any]:
    """One variant over the window: every job counts as a request, but queue and total latency
    are its online jobs' (a Batch API item or shadow copy waits in the bulk lane behind online
    work by design, for minutes: a few moved the p99), as the canary's p99 is; service time
    (claim → result) is every job's."""
    counters, samples = window.counters, window.samples
    online = [s for s in samples if not s.bulk]
    pairs = int(counters["shadow_pairs"])
    return {
        "requests": window.requests,
        "succeeded": window.requests - window.errors,
        "failed": window.errors,
        "success_rate": round(1 - window.error_rate, 6) if window.requests else None,
        "latency_ms": {
            "queue": percentiles([s.queue_ms for s in online]),
            "service": percentiles([s.service_ms for s in samples]),
            "total": percentiles([s.total_ms for s in online]),
        },
        "shadow": None
        if not pairs
        else {
            "pairs": pairs,
            "answered_pairs": int(counters["shadow_answered"]),
            "agreement": _agreement(counters),
            "mean_similarity": _mean_of(counters, "shadow_similarity", "shadow_unscored_pairs", 6),
            "mean_latency_delta_ms": _mean_of(
                counters, "shadow_latency_delta_ms", "shadow_untimed_pairs", 3
            ),
            **{failed.shown: int(counters[failed.counter]) for failed in FAILED.values()},
        },
    }


def _agreement(counters: dict[str, float]) -> float | None:
    """The share of agreeing pairs among those whose two jobs answered (a failure has no answer
    to agree with: it is counted by whose, shared/shadow_compare.FAILED); None when no pair
    answered."""
    answered = counters["shadow_answered"]
    return round(counters["shadow_agreed"] / answered, 6) if answered else None


def _mean_of(counters: dict[str, float], total: str, left_out: str, digits: int) -> float | None:
    """The mean of the `total` counter over the pairs that add to it (those counted in
    `left_out` do not), to `digits` decimals. A pair with a job that never ran (failed while
    queued) adds no latency delta (`shadow_untimed_pairs`), one with a failed job no similarity
    (`shadow_unscored_pairs`: failures are counted by whose and in the shadow's success rate);
    counted in the divisor, they pulled the mean toward 0. None when no pair adds to it."""
    added = int(counters["shadow_pairs"] - counters[left_out])
    return round(counters[total] / added, digits) if added > 0 else None


def two_proportion_z(success_a: int, n_a: int, success_b: int, n_b: int) -> tuple[float, float]:
    """(z, two-sided p) for success rate b against a, pooled standard error."""
    pooled = (success_a + success_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        return 0.0, 1.0
    z = (success_b / n_b - success_a / n_a) / se
    from scipy import stats

    return z, float(2 * stats.norm.sf(abs(z)))


def success_test(
    success_a: int, n_a: int, success_b: int, n_b: int
) -> tuple[Literal["z", "fisher"], float, float]:
    """(test, z, two-sided p) for success rate b against a: the z-test's p unless an expected
    count (successes or failures, pooled) is under MIN_EXPECTED, then Fisher's exact test's, so
    a request or two never reads as significant. z is reported either way."""
    z, p = two_proportion_z(success_a, n_a, success_b, n_b)
    pooled = (success_a + success_b) / (n_a + n_b)
    expected = [n * share for n in (n_a, n_b) for share in (pooled, 1 - pooled)]
    if min(expected) >= MIN_EXPECTED:
        return "z", z, p
    table = [[success_a, n_a - success_a], [success_b, n_b - success_b]]
    from scipy import stats

    return "fisher", z, float(stats.fisher_exact(table, alternative="two-sided").pvalue)


def versus(
    baseline_name: str, baseline: Window, other: Window, min_samples: int = MIN_SAMPLES
) -> dict[str, Any]:
    """Tests of `other` against the baseline, with a verdict once both arms have `min_samples`
    requests. The success-rate test is reported below the minimum too (Fisher's exact test
    holds at any size), once each arm has a request; the latency test needs `min_samples` timed
    samples on each arm, at least SMALL_ARM and at most WINDOW_SAMPLES (an expired job is a
    request without one). An arm with no request is insufficient data as any short one (it
    was a null report, so a variant at 0 % said nothing of the 100 requests it needs)."""
    test, z, p_success = None, None, None
    if baseline.requests and other.requests:
        base_ok, other_ok = baseline.requests - baseline.errors, other.requests - other.errors
        test, z, p_success = success_test(base_ok, baseline.requests, other_ok, other.requests)
    mine = [s.service_ms for s in other.samples]
    theirs = [s.service_ms for s in baseline.samples]
    u, p_latency = None, None
    if min(len(mine), len(theirs)) >= _timed_needed(min_samples):
        u, p_latency = _mann_whitney(mine, theirs)
    needed = {
        "baseline": max(min_samples - baseline.requests, 0),
        "variant": max(min_samples - other.requests, 0),
    }
    enough = not any(needed.values())
    if not enough or p_success is None:  # None only with an arm at 0 requests: never enough
        verdict = _not_enough_words(baseline_name, needed, min_samples)
    elif u is None or p_latency is None:
        verdict = (
            f"{_success_words(baseline_name, baseline, other, p_success)}; service time: too few"
            f" timed samples to test ({len(mine)} vs {len(theirs)}, at least"
            f" {_timed_needed(min_samples)} per arm)"
        )
    else:
        latency = _latency_words(baseline_name, theirs, mine, u, p_latency)
        verdict = f"{_success_words(baseline_name, baseline, other, p_success)}; {latency}"
    return {
        "baseline": baseline_name,
        "success_rate_test": test,
        "success_rate_z": None if z is None else round(z, 6),
        "success_rate_p": p_success,
        "latency_u": u,
        "latency_p": p_latency,
        "status": "ok" if enough else "insufficient_data",
        "samples_needed": needed,
        "verdict": verdict,
    }


def _timed_needed(min_samples: int) -> int:
    """Timed samples per arm before the latency test: `min_samples`, at least SMALL_ARM, but
    never more than a window returns (WINDOW_SAMPLES): past it the arm is sampled, not short,
    and a higher `?min_samples=` otherwise kept the test from ever running."""
    return min(max(min_samples, SMALL_ARM), WINDOW_SAMPLES)


def _mann_whitney(mine: list[float], theirs: list[float]) -> tuple[float, float]:
    """(U of `mine`, two-sided p): asymptotic, with scipy's tie and continuity corrections."""
    from scipy import stats

    result = stats.mannwhitneyu(mine, theirs, alternative="two-sided", method="asymptotic")
    return float(result.statistic), float(result.pvalue)


def _not_enough_words(name: str, needed: dict[str, int], min_samples: int) -> str:
    """Names only the arms still short: "0 more on stable" says nothing."""
    short = [
        f"{n} more on this variant" if arm == "variant" else f"{n} more on {name}"
        for arm, n in (("variant", needed["variant"]), ("baseline", needed["baseline"]))
        if n
    ]
    requests = "request" if min_samples == 1 else "requests"  # ?min_samples=1 read "1 requests"
    return f"not enough data yet: {' and '.join(short)} (at least {min_samples} {requests} per arm)"


def _success_words(name: str, baseline: Window, other: Window, p: float) -> str:
    mine, theirs = 1 - other.error_rate, 1 - baseline.error_rate
    a, b = _distinct_percents(mine, theirs)
    if p >= ALPHA:
        return f"success rate {a} vs {b}: no significant difference (p={p:.3g})"
    better = "higher" if mine > theirs else "lower"
    return f"success rate {a} is significantly {better} than {name}'s {b} (p={p:.3g})"


def _distinct_percents(a: float, b: float, least: int = 1) -> tuple[str, str]:
    """Two rates as percentages with `least` decimals, or as many more (up to 4) as it takes to
    tell them apart: at scale 99.99 % against 99.96 % is significant, and read "100.0% is
    significantly higher than 100.0%"."""
    for decimals in range(least, 5):
        text_a, text_b = f"{a:.{decimals}%}", f"{b:.{decimals}%}"
        if text_a != text_b:
            return text_a, text_b
    return f"{a:.{least}%}", f"{b:.{least}%}"  # equal, or too close to matter: as usual


def _latency_words(name: str, theirs: list[float], mine: list[float], u: float, p: float) -> str:
    """The direction is U's (`mine`'s: below half the pairs means mostly shorter), not the
    medians': with whole-ms service times they are often equal for a significant difference
    ("faster ... 2.0 vs 2.0 ms"), so the words give U's share of pairs too (the common-language
    effect size: ties count half), which says by how much."""
    a, b = float(np.median(mine)), float(np.median(theirs))
    if p >= ALPHA:
        return f"median service {a:.1f} ms vs {b:.1f} ms: no significant difference (p={p:.3g})"
    longer = u / (len(mine) * len(theirs))  # the share of pairs in which `mine` took longer
    faster, took, share = (
        ("faster", "shorter", 1 - longer) if longer < 0.5 else ("slower", "longer", longer)
    )
    # whole percents, or the decimals that tell it from half: at 100,000 samples an arm, 50.4 %
    # is significant, and read "significantly faster ... shorter in 50% of pairs"
    in_pairs, _ = _distinct_percents(share, 0.5, least=0)
    return (
        f"significantly {faster} than {name} (median service {a:.1f} vs {b:.1f} ms, {took} in"
        f" {in_pairs} of pairs, p={p:.3g})"
    )

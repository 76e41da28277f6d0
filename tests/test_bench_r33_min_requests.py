"""Part B's open-loop points send at least MIN_REQUESTS_PER_POINT requests whatever the engine's
measured speed: a busy machine's ~10 sentences/s had the smoke scale's 0.3x for 0.5 s send 1 or
2, too few for `achieved_rps` (two answers) and the percentiles, and the smoke test failed. The
points are planned by the benchmark's own functions, from a measured speed to each send time."""

from __future__ import annotations

import math

import pytest

from benchmarks.batching_efficiency import MIN_REQUESTS_PER_POINT, offered_rates, point_arrivals
from benchmarks.load import poisson_arrivals
from benchmarks.scales import FULL, SCALES, Scale

VERY_SLOW_ENGINE_PER_S = 1.0  # sentences/s: every scale's window then holds too few arrivals
# Sentences/s at which the full scale's lowest rate sends 4x the minimum in its window on
# average (80; in benchmarks/results/B.json the engine did 170 to 245).
FULL_SCALE_ENGINE_PER_S = 4 * MIN_REQUESTS_PER_POINT / (min(FULL.rate_fractions) * FULL.seconds)


@pytest.mark.parametrize("scale", SCALES.values(), ids=list(SCALES))
def test_every_point_of_a_very_slow_engine_sends_the_minimum(scale: Scale) -> None:
    """Each rate keeps sending past the scale's window until the minimum was sent, and no
    further: the window grows, the rate stays."""
    for rate in offered_rates(scale, VERY_SLOW_ENGINE_PER_S):
        arrivals = list(point_arrivals(scale, rate))
        assert len(arrivals) == MIN_REQUESTS_PER_POINT, (scale.name, rate)
        assert arrivals[-1] > scale.seconds, (scale.name, rate)
        # the same Poisson schedule at `rate`, cut at the minimum instead of at the window
        unbounded = poisson_arrivals(rate, math.inf, MIN_REQUESTS_PER_POINT)
        assert arrivals == list(unbounded), (scale.name, rate)


def test_the_minimum_leaves_the_full_scale_points_as_they_were() -> None:
    """Where the scale's window holds the minimum, a point is the plain Poisson window it
    always was: the full scale's figures keep their meaning."""
    for rate in offered_rates(FULL, FULL_SCALE_ENGINE_PER_S):
        plain = list(poisson_arrivals(rate, FULL.seconds, FULL.max_requests))
        assert list(point_arrivals(FULL, rate)) == plain, rate
        assert len(plain) > MIN_REQUESTS_PER_POINT, rate

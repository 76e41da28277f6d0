"""The experiment verdict's effect size ("shorter in N% of pairs") beside a significant
Mann-Whitney result: at the 100,000 samples a window reads, a share of 50.4 % is significant,
and printed as a whole percent it read "significantly faster ... shorter in 50% of pairs", no
effect at all. It keeps the decimals that tell it from half, as success rates do."""

from __future__ import annotations

from producer_api.experiments.statistics import versus
from shared.variant_stats import Sample, Window


def _window(service_ms: list[float]) -> Window:
    """A variant's window of succeeded online jobs with these service times."""
    window = Window()
    window.counters["requests"] = len(service_ms)
    window.samples = [Sample(True, 1.0, ms) for ms in service_ms]
    return window


def test_a_significant_effect_never_reads_as_half_the_pairs() -> None:
    baseline = [float(ms) for ms in (1, 2, 3, 4) for _ in range(25_000)]
    # 1,500 of the variant's 4 ms jobs took 3 ms: shorter in 50.375 % of pairs, p ~ 0.003
    variant = [float(ms) for ms in (1, 2, 3) for _ in range(25_000)]
    variant += [3.0] * 1_500 + [4.0] * 23_500

    report = versus("stable", _window(baseline), _window(variant))

    assert report is not None and report["latency_p"] < 0.05, report
    assert "significantly faster than stable" in report["verdict"], report["verdict"]
    assert "shorter in 50.4% of pairs" in report["verdict"], report["verdict"]

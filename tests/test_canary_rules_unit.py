"""Stack-free: when a canary must roll back. The error-rate rule runs end to end in
tests/test_canary.py (a flaky variant); the latency rule, a canary slower than its bound, is
the one no stack test drives, so both are pinned here on the decision itself."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.commands.canary import print_canary
from producer_api.canary.controller import breach
from shared.canary_store import Canary

CANARY = Canary(
    model="ab",
    variant="candidate",
    baseline="stable",
    steps=[50, 100],
    interval_s=30,
    max_error_rate=0.05,
    max_p99_ms=750,
    min_requests=40,
)
BASELINE = {"requests": 100, "errors": 1, "error_rate": 0.01, "p99_ms": 120.0}


def _numbers(error_rate: float, p99_ms: float | None) -> dict[str, Any]:
    return {"requests": 100, "errors": int(error_rate * 100), "error_rate": error_rate,
            "p99_ms": p99_ms}  # fmt: skip


@pytest.mark.parametrize(
    ("error_rate", "p99_ms"),
    [(0.01, 120.0), (0.06, 750.0), (0.0, None)],  # as the baseline; both at their bounds; idle
)
def test_a_canary_within_its_bounds_stays(error_rate: float, p99_ms: float | None) -> None:
    assert breach(CANARY, _numbers(error_rate, p99_ms), BASELINE) is None


def test_errors_beyond_the_baselines_by_more_than_the_bound_roll_back() -> None:
    reason = breach(CANARY, _numbers(0.07, 120.0), BASELINE)
    assert reason == "error rate 0.0700 exceeds the baseline's 0.0100 by more than 0.05"


def test_a_p99_above_the_bound_rolls_back_even_without_errors() -> None:
    reason = breach(CANARY, _numbers(0.0, 750.5), BASELINE)
    assert reason == "p99 750.5 ms is above 750 ms"


def test_status_shows_as_many_decisions_as_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """`--events 0` printed every decision (`[-0:]` is the whole list)."""
    canary = {"model": "ab", "variant": "c", "baseline": "s", "state": "running", "weight": 5.0}
    canary |= {"steps": [5.0, 100.0], "started_at": 100.0}
    events = [{"at": 100.0 + n, "type": "step", "weight": 5.0} for n in range(3)]
    for shown, lines in ((0, 1), (2, 3), (10, 4)):
        print_canary({"canary": canary, "events": events}, shown)
        assert len(capsys.readouterr().out.splitlines()) == lines, shown

"""Stack-free: a canary's error bound at its edge: "by more than" `max_error_rate`, in the
decimals the rates are shown in."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from producer_api.canary.controller import breach
from tests.test_canary_rules_unit import CANARY as RULES

CANARY = replace(RULES, max_error_rate=0.01)


def _numbers(errors: int) -> dict[str, Any]:
    return {"requests": 100, "errors": errors, "error_rate": errors / 100, "p99_ms": 100.0}


@pytest.mark.parametrize(("canary_errors", "baseline_errors"), [(7, 6), (2, 1), (60, 59)])
def test_an_error_rate_exactly_the_bound_above_the_baselines_holds(
    canary_errors: int, baseline_errors: int
) -> None:
    """The bound is "by more than": 7 % against 6 % with 0.01 rolled back (0.07 - 0.06 is
    0.010000000000000009 in floats) while 2 % against 1 % held."""
    mine, base = _numbers(canary_errors), _numbers(baseline_errors)
    assert breach(CANARY, mine, base) is None
    assert breach(CANARY, _numbers(canary_errors + 1), base) is not None

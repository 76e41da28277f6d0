"""A RetryPolicy that could not pause is refused when it is made, not at its first retry."""

from __future__ import annotations

import math

import pytest

from conveyor.client import InvalidArgument, RetryPolicy


@pytest.mark.parametrize(
    "policy",
    [{"base_s": -1.0}, {"cap_s": -0.5}, {"max_retry_after_s": math.nan}, {"max_retries": -1}],
)
def test_a_retry_policy_that_cannot_pause_is_refused_when_made(policy: dict[str, float]) -> None:
    """`base_s=-1` drew negative pauses: the first 429 raised time.sleep's ValueError."""
    with pytest.raises(InvalidArgument, match=next(iter(policy))):
        RetryPolicy(**policy)  # type: ignore[arg-type]

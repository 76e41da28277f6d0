"""RetryPolicy on its own: one that could not pause is refused when it is made, not at its
first retry; which transport errors it retries for a request that must not be sent twice."""

from __future__ import annotations

import math

import httpx
import pytest

from conveyor.client import InvalidArgument, RetryPolicy


@pytest.mark.parametrize(
    "policy",
    [
        {"base_s": -1.0},
        {"cap_s": -0.5},
        {"max_retry_after_s": math.nan},
        {"max_retries": -1},
        {"max_total_s": math.nan},
    ],
)
def test_a_retry_policy_that_cannot_pause_is_refused_when_made(policy: dict[str, float]) -> None:
    """`base_s=-1` drew negative pauses: the first 429 raised time.sleep's ValueError."""
    with pytest.raises(InvalidArgument, match=next(iter(policy))):
        RetryPolicy(**policy)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (httpx.ConnectError("refused"), True),
        (httpx.PoolTimeout("no connection came free"), True),
        (httpx.ReadTimeout("no answer"), False),  # it may have arrived
    ],
)
def test_a_keyless_post_is_retried_only_when_it_never_went_out(
    error: httpx.TransportError, retried: bool
) -> None:
    """A PoolTimeout (every pooled connection busy, as a thread pool's long-polls hold them)
    sent nothing: a chat or embed waiting for a connection was raised, not retried."""
    assert (RetryPolicy().after_error(0, error, repeatable=False) is not None) is retried

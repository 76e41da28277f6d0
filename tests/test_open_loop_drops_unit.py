"""Stack-free: an open loop's percentiles count the requests it never got an answer for
(dropped at its in-flight cap, failed, or cut off at the end of its drain) as slower than every
answer, as wrk2 and vegeta do. Leaving them out made part B's overloaded rows look better than
they were: a p99 over the answered requests alone said nothing of the ones that never came."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.batching_efficiency import open_loop_point, pipeline_table
from benchmarks.load import LoadResult, percentile_counting_unanswered

# 1 ms, 2 ms, ... 1000 ms.
LATENCIES_S = [i / 1000 for i in range(1, 1001)]


@pytest.mark.parametrize("q", [0, 50, 90, 99, 99.9, 100])
def test_with_every_request_answered_it_is_numpys_percentile(q: float) -> None:
    expected = np.percentile(LATENCIES_S, q) * 1000
    assert percentile_counting_unanswered(LATENCIES_S, 0, q) == pytest.approx(expected)


def test_unanswered_requests_rank_above_every_answer() -> None:
    """Of 1000 answered and 5 unanswered, the p99 is the 995th of 1005 ranked: 994.96 ms,
    where the answered alone put it at 990.01 ms."""
    assert percentile_counting_unanswered(LATENCIES_S, 5, 99) == pytest.approx(994.96)
    assert percentile_counting_unanswered(LATENCIES_S, 5, 50) == pytest.approx(503.0)


def test_a_percentile_the_unanswered_decide_is_not_measured() -> None:
    """Past 1 % unanswered the p99 falls among them: only known to exceed the slowest answer."""
    assert percentile_counting_unanswered(LATENCIES_S, 10, 99) == pytest.approx(999.91)
    assert percentile_counting_unanswered(LATENCIES_S, 11, 99) == math.inf
    assert percentile_counting_unanswered(LATENCIES_S, 11, 50) == pytest.approx(506.0)
    assert percentile_counting_unanswered([], 3, 50) == math.inf
    assert math.isnan(percentile_counting_unanswered([], 0, 50))


def _overloaded(answered: int, dropped: int, cut_off: int) -> LoadResult:
    """An open loop's result as `open_loop` leaves it: cut-off requests count as errors."""
    latencies = [(i + 1) / 1000 for i in range(answered)]
    return LoadResult(
        offered=answered + dropped + cut_off,
        latencies_s=latencies,
        dropped=dropped,
        errors=cut_off,
        sending_s=1.0,
        first_done=1.0,
        last_done=2.0,
    )


def test_part_b_shows_a_p99_the_drops_decide_as_a_lower_bound() -> None:
    """The overload of part B's committed run: 20 dropped and more cut off, over 1 % of sends."""
    point = open_loop_point("max_queue_delay_ms 0", 290.0, _overloaded(980, 12, 8))
    assert point["unanswered"] == 20 and point["unanswered_share"] == pytest.approx(0.02)
    assert point["p99_ms"] == math.inf and point["slowest_answered_ms"] == 980.0
    assert point["p50_ms"] == pytest.approx(500.5)
    [row] = pipeline_table([point]).rows
    assert row[3:8] == [500.5, "> 980.0", "20 (2.0%)", 12, 8]


def test_part_b_shows_a_measured_p99_with_its_drops_counted() -> None:
    """5 dropped of 1000: the p99 is 990.0 ms, where the 995 answered alone said 985.1."""
    point = open_loop_point("max_queue_delay_ms 0", 290.0, _overloaded(995, 5, 0))
    assert point["p99_ms"] == 990.0
    [row] = pipeline_table([point]).rows
    assert row[4] == point["p99_ms"] and row[5] == "5 (0.5%)"

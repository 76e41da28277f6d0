"""The rules a canary's steps follow (their percents, durations and `min_requests`), in one
place: the producer refuses a start that breaks them (422) and `conveyor canary start` before
any call (a usage error naming the option); held only at the producer, a CLI's steps 1e-7 apart
or `--max-step 10s` came back as an outage's exit code while it was down."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

from shared.stats_window import BUCKET_S, SAMPLES_PER_BUCKET, WINDOW_SAMPLES

WEIGHT_SLACK = 1e-6  # percent: live routes that differ by more were changed by someone else
INTERVAL_MAX_S = 86_400.0  # a step's `interval_s`: more than 0, at most a day
# A step's `max_step_s`: at least three 10 s buckets (its window counts from the first whole one
# after it), at most a week.
MAX_STEP_MIN_S = 30.0
MAX_STEP_MAX_S = 7 * 86_400.0
# A step's default `max_step_s`: this many intervals, and never less than the floor (a step's
# window counts from the first whole 10 s bucket after it; a producer may restart meanwhile).
STEP_BOUND_INTERVALS = 5
STEP_BOUND_FLOOR_S = 120.0


def default_max_step_s(interval_s: float) -> float:
    """A step's `max_step_s` when none is given."""
    return max(STEP_BOUND_INTERVALS * interval_s, STEP_BOUND_FLOOR_S)


def most_samples(max_step_s: float) -> int:
    """The most latency samples a step's window can hold before `max_step_s` ends it: the
    statistics keep SAMPLES_PER_BUCKET online ones per 10 s bucket (bulk ones only in the room
    those leave) and WINDOW_SAMPLES per window read, so a step's p99 is never judged over more
    online jobs than that."""
    return min(WINDOW_SAMPLES, SAMPLES_PER_BUCKET * math.ceil(max_step_s / BUCKET_S))


def min_requests_refusal(min_requests: int, max_step_s: float) -> str | None:
    """Why `min_requests` cannot be a canary's with steps of at most `max_step_s`, or None. A
    step's p99 is judged over `min_requests` online jobs' samples, of which the window keeps
    at most `most_samples`: asking for more, no step is ever judged, and every one rolled back
    after `max_step_s` as never judged. Refused at the start, as Argo Rollouts and Flagger
    refuse an analysis that cannot pass when it is applied, rather than judged on fewer
    samples than asked without a word."""
    most = most_samples(max_step_s)
    if min_requests <= most:
        return None
    return (
        f"{min_requests} is more than the {most} latency samples a step's window keeps within"
        f" max_step_s {max_step_s:g} s ({SAMPLES_PER_BUCKET} per {BUCKET_S} s, at most"
        f" {WINDOW_SAMPLES}): its p99 could never be judged and every step would roll back;"
        " lower min_requests or raise max_step_s"
    )


def steps_refusal(steps: Sequence[float]) -> str | None:
    """Why `steps` cannot be a canary's, or None: they must be ascending percents in (0, 100]
    (nan fails the range), each more than WEIGHT_SLACK above the one before (0 before the
    first). Closer ones are weights the controller takes for one another, so such a step only
    waited out an interval, shown at the last step's weight ("5 %" twice) or an odd one."""
    if not steps or any(not 0 < s <= 100 for s in steps) or list(steps) != sorted(set(steps)):
        return "ascending percents in (0, 100] like 5,25,50,100 (every number must be finite)"
    for before, step in pairwise([0.0, *steps]):
        if step - before <= WEIGHT_SLACK:
            return (
                f"{step!r} % is within {WEIGHT_SLACK:g} % of the {before:g} % before it, which"
                f" does not move the variant's weight: make each step more than"
                f" {WEIGHT_SLACK:g} % above the last"
            )
    return None

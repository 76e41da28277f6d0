"""The rules a canary's steps follow, in one place: the producer refuses a start that breaks
them (422) and `conveyor canary start` before any call (a usage error naming the option); held
only at the producer, a CLI's steps 1e-7 apart or `--max-step 10s` came back as an outage's exit
code while it was down."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

WEIGHT_SLACK = 1e-6  # percent: live routes that differ by more were changed by someone else
INTERVAL_MAX_S = 86_400.0  # a step's `interval_s`: more than 0, at most a day
# A step's `max_step_s`: at least three 10 s buckets (its window counts from the first whole one
# after it), at most a week.
MAX_STEP_MIN_S = 30.0
MAX_STEP_MAX_S = 7 * 86_400.0


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

"""The shape of the variant statistics' windows (`shared/variant_stats.py`): BUCKET_S-second
buckets, the latency samples each keeps, the most a window reads, and the bucket a time falls
in. Apart from the Redis side, since the CLI checks a canary's `min_requests` against them
before any call, and importing them from there cost it Redis (~0.3 s) to print its help."""

from __future__ import annotations

import math

BUCKET_S = 10
SAMPLES_PER_BUCKET = 5_000
WINDOW_SAMPLES = 100_000


def bucket_of(at_s: float) -> int:
    return int(at_s // BUCKET_S)


def window_span_s(since_s: float, until_s: float) -> float:
    """The seconds a `window` from `since_s` to `until_s` counts over: its buckets are whole,
    so it starts at the start of `since_s`'s bucket (up to BUCKET_S early, not always BUCKET_S:
    a rate over `until_s - since_s + BUCKET_S` read up to a seventh low over a minute)."""
    return max(until_s - bucket_of(since_s) * BUCKET_S, 1.0)


def first_bucket_after(at_s: float) -> float:
    """The start of the first bucket wholly after `at_s`: a window from there holds nothing
    counted before `at_s` (one from `at_s` itself starts up to BUCKET_S early)."""
    return math.ceil(at_s / BUCKET_S) * BUCKET_S

"""Weighted rendezvous routing at its edges: every hash has a finite score."""

from __future__ import annotations

import math

from shared.routing import _unit


def test_the_highest_hashes_score_finite_not_a_division_by_zero() -> None:
    """A digest in the top 1 024 of 2^64 rounded to u = 1.0, and -w / ln(1.0) raised
    ZeroDivisionError: every request of that sticky key failed. The highest stay below 1, in
    order with the rest, and the lowest above 0; a digest's unit is otherwise what it was."""
    top, near = _unit(b"\xff" * 8), _unit((2**64 - 2048).to_bytes(8, "big"))
    assert near <= top < 1.0 and math.isfinite(-1.0 / math.log(top))
    assert _unit(b"\0" * 8) > 0.0 and _unit((2**63).to_bytes(8, "big")) == (2**63 + 0.5) / 2**64

"""Stack-free: a shadow pair whose answers are missing (both succeeded with no outputs kept, or a
view without them) is a mismatch, not an agreement: two absent answers say nothing alike."""

from __future__ import annotations

from typing import Any

import pytest

from shared.shadow_compare import compare


def _job(view_outputs: dict[str, Any]) -> dict[str, Any]:
    timings = {"created": 100.0, "started": 100.5, "finished": 100.51}
    return {"status": "succeeded", "timings": timings, **view_outputs}


@pytest.mark.parametrize("outputs", [{}, {"outputs": None}])
def test_two_succeeded_jobs_without_outputs_disagree(outputs: dict[str, Any]) -> None:
    comparison = compare(_job(outputs), _job(outputs))
    assert comparison is not None
    assert not comparison.agree and comparison.similarity == 0.0
    assert comparison.error_delta == 0


def test_one_missing_answer_still_disagrees_and_equal_answers_still_agree() -> None:
    one_missing = compare(_job({"outputs": {"x": 1}}), _job({}))
    assert one_missing is not None and not one_missing.agree
    same = compare(_job({"outputs": {"x": 1}}), _job({"outputs": {"x": 1}}))
    assert same is not None and same.agree and same.similarity == 1.0

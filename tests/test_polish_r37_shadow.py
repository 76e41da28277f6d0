"""Embeddings a shadow answers in a shape the primary's cannot be compared with (or with values
that are not finite) read as similar as cosine's least, -1: at 0 a broken shadow read more like
the primary than one answering opposite vectors, and lifted its `mean_similarity`."""

from __future__ import annotations

import math
from typing import Any

import pytest

from shared.shadow_compare import compare

PRIMARY = [[1.0, 0.0], [0.0, 1.0]]


def _job(embeddings: Any) -> dict[str, Any]:
    timings = {"created": 100.0, "started": 100.5, "finished": 100.6}
    return {"status": "succeeded", "timings": timings, "outputs": {"embeddings": embeddings}}


@pytest.mark.parametrize(
    "broken",
    [
        [[1.0, 0.0]],  # a text short
        [[1.0, 0.0], [0.0, 1.0, 0.0]],  # a vector of another width
        [[1.0, 0.0], [math.nan, 1.0]],
    ],
)
def test_a_broken_shadow_is_no_more_similar_than_an_opposite_one(broken: Any) -> None:
    opposite = compare(_job(PRIMARY), _job([[-1.0, 0.0], [0.0, -1.0]]))
    shown = compare(_job(PRIMARY), _job(broken))
    assert opposite is not None and opposite.similarity == pytest.approx(-1.0)
    assert shown is not None and not shown.agree and shown.similarity == -1.0, shown
    assert shown.fields()["similarity"] == "-1.000000"

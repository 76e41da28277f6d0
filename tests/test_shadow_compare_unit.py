"""Stack-free: how a shadow's answer is compared with the primary's, per output kind (embeddings
by cosine against the threshold, generated text by exact match with a similarity beside it,
anything else by equality), with the service-time delta and the error delta."""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import pytest

from shared.shadow_compare import COSINE_THRESHOLD, compare, min_cosine


def _job(outputs: Any, status: str = "succeeded", service_s: float = 0.010) -> dict[str, Any]:
    timings = {"created": 100.0, "started": 100.5, "finished": 100.5 + service_s}
    return {"status": status, "outputs": outputs, "timings": timings}


def test_embeddings_agree_at_or_above_the_cosine_threshold() -> None:
    primary = _job({"embeddings": [[1.0, 0.0], [0.0, 1.0]]})
    close = math.cos(math.acos(COSINE_THRESHOLD) / 2)  # half the threshold angle away
    near = _job({"embeddings": [[1.0, 0.0], [math.sqrt(1 - close**2), close]]})
    far = _job({"embeddings": [[1.0, 0.0], [0.6, 0.8]]})  # the second text: cosine 0.8
    agreed = compare(primary, near)
    assert agreed.agree and agreed.similarity == pytest.approx(close)
    differed = compare(primary, far)
    assert not differed.agree and differed.similarity == pytest.approx(0.8)
    shapes = compare(primary, _job({"embeddings": [[1.0, 0.0]]}))
    assert not shapes.agree and shapes.similarity == -1.0


def test_base64_embeddings_are_compared_as_their_float32_values() -> None:
    """Jobs that asked for `encoding_format: base64` carry each vector as its little-endian
    float32 bytes; the shadow's copy of the request asked the same."""

    def packed(*vectors: list[float]) -> dict[str, Any]:
        texts = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors]
        return _job({"embeddings": texts})

    primary = packed([1.0, 0.0], [0.0, 1.0])
    agreed = compare(primary, packed([1.0, 0.0], [0.0, 1.0]))
    assert agreed.agree and agreed.similarity == pytest.approx(1.0)
    differed = compare(primary, packed([1.0, 0.0], [0.6, 0.8]))
    assert not differed.agree and differed.similarity == pytest.approx(0.8)
    as_numbers = compare(primary, _job({"embeddings": [[1.0, 0.0], [0.0, 1.0]]}))
    assert as_numbers.agree


@pytest.mark.parametrize(
    "answer",
    [
        [[1.0, None]],  # a NaN, as orjson stores it
        [[1.0, math.nan]],
        [[1.0, math.inf]],
        [[True, False]],
        [["1.0", "0.0"]],
        {"0": [1.0, 0.0]},
        [base64.b64encode(struct.pack("<2f", math.nan, 0.0)).decode()],
        ["not base64!"],
        ["AAAAAAA="],  # five bytes: no whole float32 in the last
    ],
)
def test_a_vector_of_anything_but_finite_numbers_disagrees(answer: Any) -> None:
    """It raised (None * None, a NaN into HINCRBYFLOAT), and its pair blocked every comparison
    after it."""
    compared = compare(_job({"embeddings": [[1.0, 0.0]]}), _job({"embeddings": answer}))
    assert compared is not None and not compared.agree and compared.similarity == -1.0


def test_the_lowest_cosine_is_over_every_text_whatever_its_width() -> None:
    """Rows are compared a width at a time (numpy): a text with vectors of another width, or
    one that is no vector of numbers (cosine -1), still counts, and a negative cosine is kept."""
    assert min_cosine([[1.0, 0.0], [0.0, 0.0, 2.0]], [[0.6, 0.8], [0, 0, 3]]) == pytest.approx(0.6)
    opposite = [[1.0, 0.0], [0.0, 0.0, 2.0]], [[-1.0, 0.0], [0.0, 0.0, 2.0]]
    assert min_cosine(*opposite) == pytest.approx(-1.0)
    assert min_cosine([[1.0, 0.0], [1.0]], [[1.0, 0.0], [None]]) == -1.0
    assert min_cosine([[1.0, 0.0], [1.0]], [[-1.0, 0.0], [1.0, 2.0]]) == pytest.approx(-1.0)
    assert min_cosine([[1e200, 1e200], [1.0]], [[1e200, 1e200], [1.0]]) == -1.0  # past float


def test_generated_text_agrees_on_exact_match_with_a_similarity_beside_it() -> None:
    primary = _job({"text": "the queue is in front of the model", "finish_reason": "stop"})
    same = compare(primary, _job({"text": "the queue is in front of the model"}))
    assert same.agree and same.similarity == 1.0
    close = compare(primary, _job({"text": "the queue is in front of a model"}))
    assert not close.agree and 0.9 < close.similarity < 1.0
    other = compare(primary, _job({"text": "xyz"}))
    assert not other.agree and other.similarity < 0.2


def test_other_outputs_agree_on_equality() -> None:
    assert compare(_job({"a": [1, 2]}), _job({"a": [1, 2]})).agree
    unequal = compare(_job({"a": [1, 2]}), _job({"a": [2, 1]}))
    assert not unequal.agree and unequal.similarity == 0.0


def test_latency_and_error_deltas() -> None:
    slower = compare(_job({"x": 1}, service_s=0.010), _job({"x": 1}, service_s=0.035))
    assert slower.latency_delta_ms == pytest.approx(25.0)
    only_shadow_failed = compare(_job({"x": 1}), _job(None, status="failed"))
    assert only_shadow_failed.error_delta == 1 and only_shadow_failed.agree is None
    only_primary_failed = compare(_job(None, status="failed"), _job({"x": 1}))
    assert only_primary_failed.error_delta == -1
    both_failed = compare(_job(None, status="failed"), _job(None, status="failed"))
    assert both_failed.agree is None and both_failed.error_delta == 0
    assert both_failed.counts() == {
        "shadow_pairs": 1,
        "shadow_failed_both": 1,  # two failures compare no answers: no agreement,
        "shadow_unscored_pairs": 1,  # no similarity
        "shadow_latency_delta_ms": 0.0,
    }


@pytest.mark.parametrize(
    ("primary", "shadow"), [("succeeded", "expired"), ("cancelled", "succeeded")]
)
def test_a_pair_one_of_which_never_ran_is_not_compared(primary: str, shadow: str) -> None:
    """A shadow copy that expired in its bulk lane counted as the shadow's failure (with 0 ms
    of service time, pulling its latency delta down); a primary its client cancelled, as the
    primary's."""
    assert compare(_job({"x": 1}, status=primary), _job({"x": 1}, status=shadow)) is None

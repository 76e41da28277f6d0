"""How a shadow variant's answer compares with the primary's for the same request: agreement by
output kind (embeddings: cosine at or above a threshold; generated text: exact match, with a
cheap similarity beside it; anything else: equality) over the pairs where both jobs answered,
the latency delta, and which of the two failed otherwise."""

from __future__ import annotations

import difflib
import math
import struct
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from shared.codec import float32_values
from shared.job_states import UNRUN_ERRORS

COSINE_THRESHOLD = 0.99
# The similarity of embeddings that cannot be compared (another number of texts, a vector of
# another width or of anything but finite numbers): cosine's least. At 0 a broken shadow read
# more like the primary than one answering opposite vectors, and lifted its mean similarity.
UNCOMPARABLE = -1.0
RAN = ("succeeded", "failed")  # the ends a job reaches by running (a dead letter is failed)
# every field `Comparison.fields` may hold: one a comparison lacks is dropped from a result that
# an earlier pair's comparison wrote it to (shared/shadow_pairs.py)
FIELDS = ("agree", "similarity", "error_delta", "latency_delta_ms")


class FailedCount(NamedTuple):
    counter: str  # in the shadow variant's window (shared/variant_stats)
    shown: str  # as an experiment's summary names it (producer_api/experiments/statistics)


# The counter a pair with a failure adds, by its error delta, and its name where it is shown.
# Counted apart, as shadow tests report error rates: summed as a delta, a shadow failing where
# the primary answered and one answering where it failed netted to 0, and two failures read as
# an agreement.
FAILED = {
    1: FailedCount("shadow_failed_shadow_only", "shadow_only_failed"),
    -1: FailedCount("shadow_failed_primary_only", "primary_only_failed"),
    0: FailedCount("shadow_failed_both", "both_failed"),
}


@dataclass(frozen=True, slots=True)
class Comparison:
    # None unless both jobs answered: a failure has no answer to agree with (two failures read
    # as agreeing, a failed shadow beside a good primary as disagreeing); FAILED counts them
    agree: bool | None
    # None unless both jobs answered: a failure has no answer to be like (at 0 a failed shadow
    # read more like the primary than an opposite embedding)
    similarity: float | None
    # shadow minus primary, service time (the queues differ by design); None unless both ran
    latency_delta_ms: float | None
    error_delta: int  # 1: only the shadow failed, -1: only the primary failed, 0: same fate

    def counts(self) -> dict[str, float]:
        """What one comparison adds to the shadow variant's counters (shared/variant_stats). A
        pair without a latency delta adds none and is counted in `shadow_untimed_pairs`, so the
        mean delta is the sum over the pairs less those: a job failed before it ran read as a
        service time of 0, and its delta as the other job's whole service time. Likewise a pair
        with a failure adds no similarity and is counted in `shadow_unscored_pairs`, and no
        agreement: it adds to its FAILED counter. Agreement is counted under names of its own
        (`shadow_answered`, `shadow_agreed`): `shadow_agree` of buckets written before counted
        two failures as agreeing, and mixed into a window it would read over 100 %."""
        counts: dict[str, float] = {"shadow_pairs": 1}
        if self.agree is None:
            counts[FAILED[self.error_delta].counter] = 1
        else:
            counts |= {"shadow_answered": 1, "shadow_agreed": int(self.agree)}
        if self.similarity is None:
            counts["shadow_unscored_pairs"] = 1
        else:
            counts["shadow_similarity"] = self.similarity
        if self.latency_delta_ms is None:
            counts["shadow_untimed_pairs"] = 1
        else:
            counts["shadow_latency_delta_ms"] = self.latency_delta_ms
        return counts

    def fields(self) -> dict[str, str]:
        """The comparison as kept in the primary's result; no latency delta for an untimed pair,
        no agreement or similarity for a pair with a failure (its error delta says whose)."""
        fields = {"error_delta": str(self.error_delta)}
        if self.agree is not None:
            fields["agree"] = str(int(self.agree))
        if self.similarity is not None:
            fields["similarity"] = f"{self.similarity:.6f}"
        if self.latency_delta_ms is not None:
            fields["latency_delta_ms"] = f"{self.latency_delta_ms:.3f}"
        return fields


def compare(primary: dict[str, Any], shadow: dict[str, Any]) -> Comparison | None:
    """Compare two finished job views of the same request; None unless both ran to an answer
    (succeeded or failed): a shadow copy that expired in its bulk lane, or a primary its client
    cancelled, says nothing of the variants, and was counted a failure with no service time."""
    if primary.get("status") not in RAN or shadow.get("status") not in RAN:
        return None
    ok_p, ok_s = primary.get("status") == "succeeded", shadow.get("status") == "succeeded"
    agree: bool | None = None
    similarity: float | None = None
    if ok_p and ok_s:
        agree, similarity = agreement(primary.get("outputs"), shadow.get("outputs"))
    return Comparison(agree, similarity, _latency_delta_ms(primary, shadow), int(ok_p) - int(ok_s))


def agreement(primary: Any, shadow: Any) -> tuple[bool, float]:
    """(agree, similarity) of two outputs. Similarity is in [0, 1] (difflib's ratio, 1 or 0 for
    equality) but for embeddings: their lowest cosine, in [-1, 1], is negative for vectors
    pointing away from each other, so a shadow's `mean_similarity` can be below 0 (a measure,
    not an error: the threshold only asks for COSINE_THRESHOLD or more). A missing answer
    agrees with none: two succeeded jobs without outputs read as a full agreement, whatever
    the variants would say."""
    if primary is None or shadow is None:
        return False, 0.0
    if isinstance(primary, dict) and isinstance(shadow, dict):
        if "embeddings" in primary and "embeddings" in shadow:
            cosine = min_cosine(primary["embeddings"], shadow["embeddings"])
            return cosine >= COSINE_THRESHOLD, cosine
        if isinstance(primary.get("text"), str) and isinstance(shadow.get("text"), str):
            ratio = difflib.SequenceMatcher(None, primary["text"], shadow["text"]).ratio()
            return primary["text"] == shadow["text"], ratio
    return primary == shadow, float(primary == shadow)


def min_cosine(first: Any, second: Any) -> float:
    """The lowest cosine similarity over the texts of a request: UNCOMPARABLE if the shapes
    differ or a vector is not one of finite numbers (a shadow build answering NaN disagrees; its
    pair raised, and no pair after it was ever compared). Vectorised with numpy, rows of one
    width at a time: a page of minilm pairs in pure Python took seconds."""
    if not (isinstance(first, list) and isinstance(second, list)) or len(first) != len(second):
        return UNCOMPARABLE
    if not first:
        return 0.0
    lowest = math.inf
    by_width: dict[int, list[tuple[list[float], list[float]]]] = defaultdict(list)
    for a, b in zip(first, second, strict=True):
        numbers_a, numbers_b = _numbers(a), _numbers(b)
        if numbers_a is None or numbers_b is None or len(numbers_a) != len(numbers_b):
            lowest = UNCOMPARABLE
        else:
            by_width[len(numbers_a)].append((numbers_a, numbers_b))
    for rows in by_width.values():
        lowest = min(lowest, _lowest_cosine(rows))
    return lowest


def _numbers(embedding: Any) -> list[float] | None:
    """A job that asked for `encoding_format: base64` has each vector as its little-endian
    float32 bytes; None unless a list of numbers (bools are not; finiteness is checked with
    the rows). Checks each distinct type, not each value."""
    try:
        values = float32_values(embedding) if isinstance(embedding, str) else embedding
    except (ValueError, struct.error):
        return None
    if not isinstance(values, list) or not all(map(_number_type, set(map(type, values)))):
        return None
    return values


def _number_type(kind: type) -> bool:
    return issubclass(kind, int | float) and not issubclass(kind, bool)


def _lowest_cosine(rows: list[tuple[list[float], list[float]]]) -> float:
    """The lowest cosine of pairs of vectors of one width, row by row; UNCOMPARABLE for a row
    with a value that is not finite (orjson writes a NaN as null) or a cosine past float's
    range; 0 for a zero vector's (no direction: orthogonal to any)."""
    first = np.asarray([a for a, _ in rows], dtype=np.float64)
    second = np.asarray([b for _, b in rows], dtype=np.float64)
    finite = np.isfinite(first).all(axis=1) & np.isfinite(second).all(axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        norm = np.sqrt(_row_dots(first, first)) * np.sqrt(_row_dots(second, second))
        dots = _row_dots(first, second)
        cosine = np.divide(dots, norm, out=np.zeros_like(dots), where=norm != 0)
    return float(np.where(finite & np.isfinite(cosine), cosine, UNCOMPARABLE).min())


def _row_dots(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.einsum("ij,ij->i", a, b)


def _latency_delta_ms(primary: dict[str, Any], shadow: dict[str, Any]) -> float | None:
    """The shadow's service time less the primary's; None unless both have one (a job failed
    before it ran has none: dead-lettered before a run, it has no `started` stamp; failed unrun
    by a worker, UNRUN_ERRORS, it has the worker's read as `started`)."""
    shadow_ms, primary_ms = _service_ms(shadow), _service_ms(primary)
    if shadow_ms is None or primary_ms is None:
        return None
    return shadow_ms - primary_ms


def _service_ms(view: dict[str, Any]) -> float | None:
    timings, error = view.get("timings", {}), view.get("error")
    if isinstance(error, dict) and error.get("type") in UNRUN_ERRORS:
        return None
    if "started" in timings and "finished" in timings:
        return float((timings["finished"] - timings["started"]) * 1000.0)
    return None

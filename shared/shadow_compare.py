"""How a shadow variant's answer compares with the primary's for the same request: agreement by
output kind (embeddings: cosine at or above a threshold; generated text: exact match, with a
cheap similarity beside it; anything else: equality), the latency delta and the error delta."""

from __future__ import annotations

import difflib
import math
import struct
from dataclasses import dataclass
from typing import Any

from shared.codec import float32_values

COSINE_THRESHOLD = 0.99
RAN = ("succeeded", "failed")  # the ends a job reaches by running (a dead letter is failed)


@dataclass(frozen=True, slots=True)
class Comparison:
    agree: bool
    similarity: float
    latency_delta_ms: float  # shadow minus primary, service time (the queues differ by design)
    error_delta: int  # 1: only the shadow failed, -1: only the primary failed, 0: same fate

    def counts(self) -> dict[str, float]:
        """What one comparison adds to the shadow variant's counters (shared/variant_stats)."""
        return {
            "shadow_pairs": 1,
            "shadow_agree": int(self.agree),
            "shadow_similarity": self.similarity,
            "shadow_latency_delta_ms": self.latency_delta_ms,
            "shadow_error_delta": self.error_delta,
        }

    def fields(self) -> dict[str, str]:
        return {
            "agree": str(int(self.agree)),
            "similarity": f"{self.similarity:.6f}",
            "latency_delta_ms": f"{self.latency_delta_ms:.3f}",
            "error_delta": str(self.error_delta),
        }


def compare(primary: dict[str, Any], shadow: dict[str, Any]) -> Comparison | None:
    """Compare two finished job views of the same request; None unless both ran to an answer
    (succeeded or failed): a shadow copy that expired in its bulk lane, or a primary its client
    cancelled, says nothing of the variants, and was counted a failure with no service time."""
    if primary.get("status") not in RAN or shadow.get("status") not in RAN:
        return None
    ok_p, ok_s = primary.get("status") == "succeeded", shadow.get("status") == "succeeded"
    if ok_p and ok_s:
        agree, similarity = agreement(primary.get("outputs"), shadow.get("outputs"))
    else:
        agree, similarity = ok_p == ok_s, float(ok_p == ok_s)
    return Comparison(
        agree, similarity, _service_ms(shadow) - _service_ms(primary), int(ok_p) - int(ok_s)
    )


def agreement(primary: Any, shadow: Any) -> tuple[bool, float]:
    """(agree, similarity in [0, 1]) of two outputs."""
    if isinstance(primary, dict) and isinstance(shadow, dict):
        if "embeddings" in primary and "embeddings" in shadow:
            cosine = min_cosine(primary["embeddings"], shadow["embeddings"])
            return cosine >= COSINE_THRESHOLD, cosine
        if isinstance(primary.get("text"), str) and isinstance(shadow.get("text"), str):
            ratio = difflib.SequenceMatcher(None, primary["text"], shadow["text"]).ratio()
            return primary["text"] == shadow["text"], ratio
    return primary == shadow, float(primary == shadow)


def min_cosine(first: Any, second: Any) -> float:
    """The lowest cosine similarity over the texts of a request: 0 if the shapes differ or a
    vector is not one of finite numbers (a shadow build answering NaN disagrees; its pair raised,
    and no pair after it was ever compared)."""
    if not (isinstance(first, list) and isinstance(second, list)) or len(first) != len(second):
        return 0.0
    if not first:
        return 0.0
    return min(_cosine(_vector(a), _vector(b)) for a, b in zip(first, second, strict=True))


def _vector(embedding: Any) -> list[float] | None:
    """A job that asked for `encoding_format: base64` has each vector as its little-endian
    float32 bytes; None unless a list of finite numbers (orjson writes a NaN as null)."""
    try:
        values = float32_values(embedding) if isinstance(embedding, str) else embedding
    except (ValueError, struct.error):
        return None
    if not isinstance(values, list) or not all(_finite(value) for value in values):
        return None
    return values


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _cosine(a: list[float] | None, b: list[float] | None) -> float:
    if a is None or b is None or len(a) != len(b):
        return 0.0
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    cosine = sum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 0.0
    return cosine if math.isfinite(cosine) else 0.0  # magnitudes past float's range


def _service_ms(view: dict[str, Any]) -> float:
    timings = view.get("timings", {})
    if "started" in timings and "finished" in timings:
        return float((timings["finished"] - timings["started"]) * 1000.0)
    return 0.0

"""`conveyor_batch_size` has a finite bucket for every batch a model may be configured for: its
buckets stopped at 256 while `max_batch_size` and `max_num_seqs` go up to `MAX_JOBS_PER_READ`
(4096), so every batch past 256 fell in `+Inf` alone and the dashboard's p50 and p95 of a pool
batching 1,000 at a time read 256."""

from __future__ import annotations

from prometheus_client import REGISTRY

from shared.metrics import BATCH_SIZE
from shared.model_repository import MAX_JOBS_PER_READ

LABELS = {"model": "health-edges-r8-buckets", "variant": "largest"}


def test_the_largest_batch_a_model_may_take_lands_in_a_finite_bucket() -> None:
    BATCH_SIZE.labels(**LABELS).observe(MAX_JOBS_PER_READ)
    try:
        buckets = {
            float(sample.labels["le"]): sample.value
            for family in REGISTRY.collect()
            if family.name == "conveyor_batch_size"
            for sample in family.samples
            if sample.name.endswith("_bucket") and LABELS.items() <= sample.labels.items()
        }
    finally:
        BATCH_SIZE.remove(*LABELS.values())
    finite = {le: count for le, count in buckets.items() if le != float("inf")}
    assert max(finite.values()) == 1, buckets  # counted below +Inf: a quantile can read it

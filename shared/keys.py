"""The one place that names Redis keys, so producer, workers and tooling agree on them."""

from __future__ import annotations

from dataclasses import dataclass

GROUP = "workers"


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under a configurable prefix (default `cv:`); see DESIGN.md's data-plane table."""

    prefix: str = "cv:"

    def queue(self, model: str, variant: str) -> str:
        return f"{self.prefix}q:{model}:{variant}"

    def bulk_queue(self, model: str, variant: str) -> str:
        return f"{self.prefix}q:{model}:{variant}:bulk"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    @property
    def job_prefix(self) -> str:
        return f"{self.prefix}job:"

    def tokens(self, job_id: str) -> str:
        return f"{self.prefix}tok:{job_id}"

    def reply(self, producer: str) -> str:
        return f"{self.prefix}reply:{producer}"

    def drained(self, stream: str, second: int) -> str:
        """Entries a partition finished in one wall-clock second (drain rate for Retry-After)."""
        return f"{stream}:drained:{second}"

    def dlq(self, model: str, variant: str) -> str:
        return f"{self.prefix}dlq:{model}:{variant}"

    def idempotency(self, tenant: str, key: str) -> str:
        return f"{self.prefix}idem:{tenant}:{key}"

    def routes(self, model: str) -> str:
        return f"{self.prefix}routes:{model}"

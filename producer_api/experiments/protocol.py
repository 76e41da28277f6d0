"""Response body of the experiments resource."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from shared.stats_window import WINDOW_SAMPLES


class Percentiles(BaseModel):
    p50: float
    p95: float
    p99: float


class Latencies(BaseModel):
    queue: Percentiles | None
    service: Percentiles | None
    total: Percentiles | None


class SamplesNeeded(BaseModel):
    baseline: int
    variant: int


class VersusBaseline(BaseModel):
    baseline: str
    success_rate_test: Literal["z", "fisher"] | None = Field(
        description="The test behind success_rate_p: the two-proportion z-test, or Fisher's "
        "exact test when an expected count is under 5 (success_rate_z is then informative "
        "only); null, as success_rate_z and success_rate_p, while an arm has no request"
    )
    success_rate_z: float | None
    success_rate_p: float | None
    latency_u: float | None
    latency_p: float | None = Field(
        description="Null until both arms have min_samples timed samples (service times), "
        f"or {WINDOW_SAMPLES} (the most a window reads) when min_samples is higher"
    )
    status: Literal["ok", "insufficient_data"] = Field(
        description="insufficient_data until both arms have min_samples requests: the verdict "
        "then says how many more each needs, and judges nothing"
    )
    samples_needed: SamplesNeeded = Field(
        description="Requests each arm still needs before a verdict (0 once it has enough)"
    )
    verdict: str


class VariantReport(BaseModel):
    variant: str
    role: str
    weight: float
    shadow_rate: float | None
    requests: int
    succeeded: int
    failed: int
    success_rate: float | None
    latency_ms: Latencies
    shadow: dict[str, Any] | None
    vs_baseline: VersusBaseline | None


class ExperimentReport(BaseModel):
    model: str
    window_s: float = Field(
        description="Seconds the numbers cover: the window asked for, from the start of its "
        "first 10 s bucket (up to 10 s more)"
    )
    baseline: str
    min_samples: int = Field(description="Requests per arm before a verdict (?min_samples=)")
    variants: list[VariantReport]

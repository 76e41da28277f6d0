"""Request and response bodies of the canary resource."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.canary_steps import INTERVAL_MAX_S, MAX_STEP_MAX_S, MAX_STEP_MIN_S
from shared.model_names import NAME


class CanaryStart(BaseModel):
    """A canary's rollout and bounds. Finite numbers only: pydantic's lax mode read "Infinity"
    as inf, which the stored record keeps as null, and every decision then raised. Strict ones:
    lax mode read `max_error_rate: true` as 1.0, a canary no error rate could roll back."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    variant: str = Field(pattern=NAME)
    baseline: str | None = Field(default=None, description="Default: the model's default variant")
    steps: list[float] = Field(default=[5, 25, 50, 100], min_length=1, max_length=100)
    interval_s: float = Field(default=60.0, gt=0, le=INTERVAL_MAX_S)
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    max_p99_ms: float = Field(default=500.0, gt=0)
    min_requests: int = Field(default=200, ge=1)
    max_step_s: float | None = Field(
        default=None,
        ge=MAX_STEP_MIN_S,
        le=MAX_STEP_MAX_S,
        description="How long a step may stay short of min_requests before it rolls back."
        " Default: 5 intervals, at least 120 s",
    )
    webhook: str | None = Field(default=None, max_length=2048)


class CanaryView(BaseModel):
    canary: dict[str, Any] | None
    warnings: list[str] = Field(
        default_factory=list,
        description="While it runs: its variant has no worker serving or warming up, by heartbeat",
    )
    events: list[dict[str, Any]]

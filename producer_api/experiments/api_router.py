"""HTTP route of the experiments resource: parse, call ExperimentsService, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from producer_api.auth import AUTH_RESPONSES, acting_for
from producer_api.errors import ErrorBody
from producer_api.experiments.protocol import ExperimentReport
from producer_api.experiments.serving import ExperimentsService
from producer_api.experiments.statistics import MIN_SAMPLES
from producer_api.responses import FastJSONResponse
from shared.model_names import NAME

router = APIRouter(tags=["experiments"])


@router.get(
    "/v1/experiments/{model}",
    response_model=ExperimentReport,
    responses={
        **AUTH_RESPONSES,
        404: {"model": ErrorBody, "description": "Unknown model"},
        422: {"model": ErrorBody, "description": "Unknown baseline variant"},
    },
)
async def experiment(
    service: Annotated[ExperimentsService, Depends(acting_for("read", ExperimentsService))],
    model: str = Path(pattern=NAME),
    window_s: float = Query(default=3600.0, gt=0, le=21_600, allow_inf_nan=False),
    baseline: str | None = Query(default=None, pattern=NAME),
    min_samples: int = Query(default=MIN_SAMPLES, ge=1, le=1_000_000),
) -> FastJSONResponse:
    """Per variant over the window: requests, success rate, queue/service/total latency
    percentiles, shadow agreement, and z / Mann-Whitney tests against the baseline, judged once
    each arm has min_samples requests."""
    return FastJSONResponse(await service.report(model, window_s, baseline, min_samples))

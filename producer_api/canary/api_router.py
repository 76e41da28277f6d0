"""HTTP routes of the canary resource: parse, call CanaryService, return. Admin scope only."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from producer_api.auth import AUTH_RESPONSES, acting_for
from producer_api.canary.protocol import CanaryStart, CanaryView
from producer_api.canary.serving import CanaryService
from producer_api.errors import ErrorBody
from producer_api.responses import FastJSONResponse
from shared.model_names import NAME

router = APIRouter(tags=["canary"])
MODEL = Path(pattern=NAME)
_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    404: {"model": ErrorBody, "description": "Unknown model"},
    409: {"model": ErrorBody, "description": "A canary is (not) running"},
    413: {"model": ErrorBody, "description": "Body over CONVEYOR_MAX_BODY_BYTES"},
    422: {"model": ErrorBody, "description": "Unknown variant, bad steps or webhook"},
}


Service = Annotated[CanaryService, Depends(acting_for("admin", CanaryService))]


@router.post(
    "/v1/models/{model}/canary", status_code=201, response_model=CanaryView, responses=_ERRORS
)
async def start_canary(body: CanaryStart, service: Service, model: str = MODEL) -> FastJSONResponse:
    """Start stepping `variant` up while it stays within its bounds (409 if one is running)."""
    return FastJSONResponse(await service.start(model, body), status_code=201)


@router.get("/v1/models/{model}/canary", response_model=CanaryView, responses=_ERRORS)
async def canary_status(
    service: Service, model: str = MODEL, events: int = Query(default=100, ge=1, le=500)
) -> FastJSONResponse:
    """The model's latest canary and its decisions, each with the numbers behind it."""
    return FastJSONResponse(await service.show(model, events))


@router.delete("/v1/models/{model}/canary", response_model=CanaryView, responses=_ERRORS)
async def abort_canary(service: Service, model: str = MODEL) -> FastJSONResponse:
    """Stop the running canary and put it back to 0 %."""
    return FastJSONResponse(await service.abort(model))

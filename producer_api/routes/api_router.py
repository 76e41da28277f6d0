"""HTTP routes of the routes resource: parse, call RoutesService, return. Admin scope only."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from producer_api.auth import AUTH_RESPONSES, acting_for
from producer_api.errors import ErrorBody
from producer_api.responses import FastJSONResponse
from producer_api.routes.protocol import RoutesBody, RoutesView
from producer_api.routes.serving import RoutesService
from shared.model_names import NAME

router = APIRouter(tags=["routes"])
MODEL = Path(pattern=NAME)
_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    404: {"model": ErrorBody, "description": "Unknown model"},
    409: {"model": ErrorBody, "description": "expected_version is stale"},
    413: {"model": ErrorBody, "description": "Body over CONVEYOR_MAX_BODY_BYTES"},
    422: {"model": ErrorBody, "description": "Unknown variant, weights not summing to 100..."},
}


Service = Annotated[RoutesService, Depends(acting_for("admin", RoutesService))]


@router.get("/v1/models/{model}/routes", response_model=RoutesView, responses=_ERRORS)
async def get_routes(
    service: Service, model: str = MODEL, history: int = Query(default=20, ge=0, le=1000)
) -> FastJSONResponse:
    """The model's live routes, version and latest changes (who, when, old → new)."""
    return FastJSONResponse(await service.show(model, history))


@router.put("/v1/models/{model}/routes", response_model=RoutesView, responses=_ERRORS)
async def put_routes(body: RoutesBody, service: Service, model: str = MODEL) -> FastJSONResponse:
    """Replace the model's routes; every producer applies them within a second."""
    return FastJSONResponse(await service.replace(model, body))


@router.delete("/v1/models/{model}/routes", response_model=RoutesView, responses=_ERRORS)
async def reset_routes(
    service: Service,
    model: str = MODEL,
    expected_version: int | None = Query(
        default=None, ge=0, description="Refuse (409) unless the routes are still at this version"
    ),
) -> FastJSONResponse:
    """Put config.yaml's routes back (a new version, logged); every producer applies them
    within a second."""
    return FastJSONResponse(await service.reset(model, expected_version))

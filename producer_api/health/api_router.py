"""`/healthz`: the process is alive; `/readyz`: it can serve (Redis answers, models known)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from redis.exceptions import RedisError

from producer_api.errors import error_response
from producer_api.responses import FastJSONResponse
from producer_api.state import ProducerState, producer_state

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(state: Annotated[ProducerState, Depends(producer_state)]) -> FastJSONResponse:
    try:
        await state.redis.ping()
    except RedisError as exc:
        return error_response(503, "unavailable", f"redis unreachable: {exc}", {"Retry-After": "1"})
    if not state.repository.models:
        return error_response(503, "unavailable", "no models in the repository")
    return FastJSONResponse({"status": "ready", "models": sorted(state.repository.models)})

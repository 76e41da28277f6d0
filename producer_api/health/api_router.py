"""`/healthz`: the process is alive; `/readyz`: it can serve (Redis answers, models known).
Readiness answers within `READY_TIMEOUT_S` whatever Redis does, so a load balancer's probe sees
a 503 rather than timing out on a frozen Redis."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends
from redis.exceptions import RedisError

from producer_api.errors import error_response
from producer_api.responses import FastJSONResponse
from producer_api.state import ProducerState, producer_state

router = APIRouter(tags=["health"])
READY_TIMEOUT_S = 0.5


@router.get("/healthz")
async def healthz(state: Annotated[ProducerState, Depends(producer_state)]) -> dict[str, str]:
    """Alive, and which producer this is (`conveyor up` checks its port answers as its own)."""
    return {"status": "ok", "instance": state.settings.instance_id}


@router.get("/readyz")
async def readyz(state: Annotated[ProducerState, Depends(producer_state)]) -> FastJSONResponse:
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await state.redis.ping()
    except (RedisError, TimeoutError) as exc:
        message = f"redis unreachable: {exc!r}"
        return error_response(503, "unavailable", message, {"Retry-After": "1"})
    if not state.repository.models:
        return error_response(503, "unavailable", "no models in the repository")
    return FastJSONResponse({"status": "ready", "models": sorted(state.repository.models)})

"""HTTP routes of the models resource."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from producer_api.auth import AUTH_RESPONSES, Principal, require
from producer_api.models.protocol import ModelList
from producer_api.models.serving import ModelsService
from producer_api.responses import FastJSONResponse
from producer_api.state import ProducerState, producer_state

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList, responses=AUTH_RESPONSES)
async def list_models(
    state: Annotated[ProducerState, Depends(producer_state)],
    principal: Annotated[Principal, Depends(require("read"))],
) -> FastJSONResponse:
    """Every model the caller's key may use, with its partitions' queue length, lag, pending,
    consumers and DLQ depth."""
    listing = await ModelsService(state).list_models()
    listing["data"] = [card for card in listing["data"] if principal.may_use(card["id"])]
    return FastJSONResponse(listing)

"""HTTP routes of the models resource."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path

from producer_api.auth import AUTH_RESPONSES, Principal, require
from producer_api.errors import OpenAIErrorBody, answer_as_openai
from producer_api.models.protocol import ModelCard, ModelList
from producer_api.models.serving import ModelsService, model_of
from producer_api.responses import FastJSONResponse
from producer_api.state import ProducerState, producer_state

router = APIRouter(tags=["models"])
State = Annotated[ProducerState, Depends(producer_state)]
Reader = Annotated[Principal, Depends(require("read"))]


@router.get(
    "/v1/models",
    response_model=ModelList,
    responses=AUTH_RESPONSES,
    dependencies=[Depends(answer_as_openai)],
)
async def list_models(state: State, principal: Reader) -> FastJSONResponse:
    """Every model the caller's key may use, with its partitions' queue length, lag, pending,
    consumers and DLQ depth."""
    listing = await ModelsService(state).list_models()
    listing["data"] = [card for card in listing["data"] if principal.may_use(card["id"])]
    return FastJSONResponse(listing)


@router.get(
    "/v1/models/{model}",
    response_model=ModelCard,
    responses={
        **AUTH_RESPONSES,
        404: {"model": OpenAIErrorBody, "description": "Unknown model (`code` model_not_found)"},
    },
    dependencies=[Depends(answer_as_openai)],
)
async def get_model(state: State, principal: Reader, model: str = Path()) -> FastJSONResponse:
    """One model as the list shows it (OpenAI's retrieve-model call): whether its partitions
    have consumers and how much waits in them; 403 when the key may not use it. An unknown
    model, a name no model could have too, is OpenAI's 404 (`code` model_not_found, as OpenAI's
    API and the other OpenAI routes answer it: its SDK users read `e.code`)."""
    return FastJSONResponse(await ModelsService(state).get_model(model_of(state, principal, model)))

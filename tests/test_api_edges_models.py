"""`GET /v1/models/{model}` is OpenAI's retrieve-model call (`client.models.retrieve`): an
unknown model answers as OpenAI's API does there and as the other OpenAI routes answer it (404,
`invalid_request_error`, `param` "model", `code` "model_not_found"), where Conveyor's shape left
the SDK's `e.code` None. A producer served in-process over a real Valkey; no worker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client, openai_sdk


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="api-edges-models")
    async with app_client(create_app(settings)) as client:
        yield client


async def test_retrieving_an_unknown_model_is_openais_not_found(
    producer: httpx.AsyncClient,
) -> None:
    for name in ("nope", "SmolLM2"):  # a name no model could have too
        response = await producer.get(f"/v1/models/{name}")
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error.pop("message") == f"model {name!r} not found", error
        assert error == {
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    with pytest.raises(openai.NotFoundError) as raised:
        await openai_sdk(producer).models.retrieve("x" * 300)
    assert (raised.value.code, raised.value.param) == ("model_not_found", "model")
    assert len(raised.value.message) < 300, raised.value.message
    assert (await producer.get("/v1/models/identity")).json()["id"] == "identity"


async def test_retrieve_documents_its_not_found_as_it_is_answered(
    producer: httpx.AsyncClient,
) -> None:
    schema = (await producer.get("/openapi.json")).json()
    documented = schema["paths"]["/v1/models/{model}"]["get"]["responses"]["404"]["content"]
    assert documented["application/json"]["schema"]["$ref"].endswith("/OpenAIErrorBody")

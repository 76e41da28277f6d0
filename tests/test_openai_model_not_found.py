"""An unknown model on OpenAI's routes answers as OpenAI's API does (404, `invalid_request_error`,
`param` "model", `code` "model_not_found"; vLLM's server answers a 404 too): OpenAI's SDK users
read `e.code` and `e.body`, which Conveyor's own shape (`type` "not_found") left None. Conveyor's
routes keep Conveyor's shape. A producer served in-process over a real Valkey; no worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.openai import OPENAI_PATHS
from shared.settings import Settings
from tests.app_client import app_client, openai_sdk

BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/embeddings": {"input": "hi"},
}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="model-not-found")
    async with app_client(create_app(settings)) as client:
        yield client


async def test_an_unknown_model_is_openais_not_found_on_its_routes_only(
    producer: httpx.AsyncClient,
) -> None:
    assert set(BODIES) == OPENAI_PATHS
    for path, body in BODIES.items():
        response = await producer.post(path, json={"model": "nope", **body})
        assert response.status_code == 404, (path, response.text)
        error = response.json()["error"]
        assert error.pop("message") == "model 'nope' not found", error
        assert error == {
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    with pytest.raises(openai.NotFoundError) as raised:
        await openai_sdk(producer).completions.create(model="nope", prompt="hi")
    assert (raised.value.code, raised.value.param) == ("model_not_found", "model")
    job = await producer.post("/v1/jobs", json={"model": "nope", "inputs": {}})
    assert job.status_code == 404
    assert job.json() == {"error": {"type": "not_found", "message": "model 'nope' not found"}}


async def test_openais_routes_document_their_not_found_as_it_is_answered(
    producer: httpx.AsyncClient,
) -> None:
    """An unknown model's 404 in OpenAI's shape; an unknown variant's (a Conveyor field) in
    Conveyor's."""
    schema = (await producer.get("/openapi.json")).json()
    for path in OPENAI_PATHS:
        documented = schema["paths"][path]["post"]["responses"]["404"]["content"]
        bodies = documented["application/json"]["schema"]["anyOf"]
        assert {body["$ref"].rsplit("/", 1)[-1] for body in bodies} == {
            "OpenAIErrorBody",
            "ErrorBody",
        }
    jobs = schema["paths"]["/v1/jobs"]["post"]["responses"]["404"]["content"]
    assert jobs["application/json"]["schema"]["$ref"].endswith("/ErrorBody")

"""A body FastAPI will not read as JSON is refused for its Content-Type, whatever it holds, as
the README says ("a body not sent as `Content-Type: application/json`: the message says so").
The request boundary took a body with no Content-Type for JSON, which FastAPI (strict about
content types) does not: the same body answered "not acceptable JSON" when it did not parse and
"send a JSON object with Content-Type" when it did. And the message's own test took any `*/json`
for JSON: a `text/json` body, which FastAPI never parses, was told "Input should be a valid
dictionary", sending its client looking for a fault in its JSON. A producer served in-process
over a real Valkey; nothing reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client

GOOD = b'{"model": "identity", "inputs": {"x": 1}}'
BAD = b'{"model": "identity", "inputs": {'


@pytest.fixture(scope="module")
async def producer(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="edge-r11-type")
    async with app_client(create_app(settings)) as client:
        yield client


@pytest.mark.parametrize("content_type", [None, "text/json", "text/plain"])
async def test_a_body_not_sent_as_json_is_refused_for_its_type(
    producer: httpx.AsyncClient, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    for path, status in (("/v1/jobs", 422), ("/v1/chat/completions", 400)):
        for body in (GOOD, BAD):
            refused = await producer.post(path, content=body, headers=headers)
            assert refused.status_code == status, refused.text
            message = refused.json()["error"]["message"]
            assert message.startswith("body: send a JSON object with Content-Type"), message
            assert f"this request's is {content_type or 'missing'}" in message


async def test_a_json_type_with_parameters_is_still_json(producer: httpx.AsyncClient) -> None:
    for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        taken = await producer.post(
            "/v1/jobs", content=GOOD, headers={"Content-Type": content_type}
        )
        assert taken.status_code == 202, taken.text
        refused = await producer.post(
            "/v1/jobs", content=BAD, headers={"Content-Type": content_type}
        )
        assert refused.status_code == 422, refused.text
        assert "not acceptable JSON" in refused.json()["error"]["message"]

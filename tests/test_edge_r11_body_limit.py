"""A body over the limit is refused without being read, and the refusal ends the connection:
on a kept-alive one uvicorn went on reading the rest of the body (and dropping it), so a client
sending 1 GB chunked, or any client that reads no answer before its body is sent, was taken
for all of it and heard the 413 only then. And a Content-Length is a run of digits, leading zeros
allowed (RFC 9110 8.6), which llhttp (uvicorn's parser) reads as 1 from `000…01` however many
zeros come first; the boundary made an int of it, and Python reads no more than 4,300 digits:
such a length answered 500 where its body should have been taken or refused as any other. A
producer served in-process over a real Valkey; nothing reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from producer_api.app import create_app
from shared.settings import Settings

LIMIT = 4096
BODY = b'{"model": "identity", "inputs": {"x": 1}}'
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
async def producer(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        redis_url=redis_url, auth="disabled", instance_id="edge-r11-limit", max_body_bytes=LIMIT
    )
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    client = httpx.AsyncClient(transport=transport, base_url="http://localhost")
    async with app.router.lifespan_context(app), client:
        yield client


async def test_a_declared_length_of_any_digits_is_compared_not_a_500(
    producer: httpx.AsyncClient,
) -> None:
    cases = [
        ("0" * 5000 + str(len(BODY)), 202),
        ("0004096", 202),  # leading zeros change nothing
        ("9" * 5000, 413),
        ("0" * 5000 + str(LIMIT + 1), 413),
    ]
    for declared, status in cases:
        headers = {**JSON, "Content-Length": declared}
        answer = await producer.post("/v1/jobs", content=BODY, headers=headers)
        assert answer.status_code == status, (declared[-8:], answer.text)


async def test_a_body_over_the_limit_is_refused_and_the_connection_closed(
    producer: httpx.AsyncClient,
) -> None:
    sent: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        while len(sent) < 64:  # a stream the boundary must stop reading
            sent.append(1024)
            yield b" " * 1024

    declared = await producer.post("/v1/jobs", content=b" " * (LIMIT + 1), headers=JSON)
    chunked = await producer.post("/v1/jobs", content=endless(), headers=JSON)
    for refused in (declared, chunked):
        assert refused.status_code == 413, refused.text
        assert refused.json()["error"]["type"] == "payload_too_large"
        assert refused.headers["connection"] == "close"
    assert sum(sent) <= LIMIT + 1024  # read up to the limit, not whole

"""A request no route takes is answered by the router, 404 for its path or 405 with `Allow` for
its method, in the API's error shape, whatever its body holds. The request boundary checked
every body first: a mistyped path or method sent with a body that did not parse was told "not
acceptable JSON" (422), one in gzip "Content-Encoding gzip is not supported" (415), and heard
of its path only once its body was mended. A producer served in-process over a real Valkey;
nothing reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from producer_api.app import create_app
from shared.settings import Settings

BROKEN = b'{"model": "identity", "inputs": {'
DEEP = b"[" * 500 + b"]" * 500


@pytest.fixture(scope="module")
async def producer(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="edge-r11-unrouted")
    app = create_app(settings)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")
    async with app.router.lifespan_context(app), client:
        yield client


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("POST", "/v1/job", 404), ("POST", "/nowhere/at/all", 404), ("PUT", "/v1/jobs", 405)],
)
async def test_a_request_no_route_takes_hears_of_its_route_not_its_body(
    producer: httpx.AsyncClient, method: str, path: str, status: int
) -> None:
    bodies = [
        (BROKEN, {"Content-Type": "application/json"}),
        (DEEP, {"Content-Type": "application/json"}),
        (b"\x1f\x8b\x08\x00", {"Content-Type": "application/json", "Content-Encoding": "gzip"}),
    ]
    for body, headers in bodies:
        answer = await producer.request(method, path, content=body, headers=headers)
        assert answer.status_code == status, (headers, answer.text)
        assert answer.json()["error"]["type"] in ("not_found", "http_error")
        if status == 405:
            assert answer.headers["allow"] == "POST"


async def test_a_routed_request_still_has_its_body_checked(producer: httpx.AsyncClient) -> None:
    answer = await producer.post(
        "/v1/jobs", content=DEEP, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422
    assert "nested deeper than 64 levels" in answer.json()["error"]["message"]

"""The producer served under an ASGI root path (`uvicorn --root-path /conveyor`, as FastAPI
documents for a path-stripping proxy): the server puts the root path before the request's path,
which Starlette's router reads past, but the middlewares compared the whole path with their
routes' bare paths: an upload was held to the JSON body limit (413), a JSONL batch sent as
`application/json` was parsed as one JSON value (422), OpenAI's routes answered their errors in
Conveyor's shape. On a producer run in-process on a real Valkey, as uvicorn hands it requests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from producer_api.app import create_app
from shared.settings import Settings

ROOT = "/conveyor"
BODY_BYTES, UPLOAD_BYTES = 512, 65_536
LINE = b'{"custom_id": "c%d", "body": {"inputs": {"text": "' + b"x" * 40 + b'"}}}\n'


@pytest.fixture(scope="module")
async def rooted(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The producer, auth disabled and its body limits small, under ROOT: every request's ASGI
    path starts with ROOT, as uvicorn --root-path makes it."""
    settings = Settings(
        redis_url=redis_url,
        key_prefix="root-path-r37:",
        auth="disabled",
        max_body_bytes=BODY_BYTES,
        max_upload_bytes=UPLOAD_BYTES,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, root_path=ROOT)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://localhost{ROOT}") as c:
            yield c


def _jsonl(lines: int) -> bytes:
    return b"".join(LINE.replace(b"%d", b"%d" % n) for n in range(lines))


async def test_an_upload_past_the_body_limit_is_held_to_the_upload_limit(
    rooted: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    data = _jsonl(20)
    assert BODY_BYTES < len(data) < UPLOAD_BYTES
    files = {"file": ("big.jsonl", data)}
    uploaded = await rooted.post("/v1/files", files=files, data={"purpose": "batch"})
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["bytes"] == len(data)


async def test_a_jsonl_batch_sent_as_json_is_read_line_by_line(
    rooted: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """The JSONL routes parse their bodies themselves: two lines are no one JSON value."""
    created = await rooted.post(
        "/v1/batches",
        params={"model": "identity"},
        content=_jsonl(2),
        headers={"Content-Type": "application/json"},
    )
    assert created.status_code == 202, created.text
    assert created.json()["request_counts"]["total"] == 2


async def test_openais_routes_answer_errors_in_openais_shape(rooted: httpx.AsyncClient) -> None:
    """An invalid request (OpenAI's 400, not a 422), one refused before routing (413) and a
    route under `/v1/` Conveyor lacks (404), each `{"message", "type", "param", "code"}`."""
    answers = {
        "invalid": await rooted.post("/v1/embeddings", json={"model": "minilm"}),
        "too large": await rooted.post("/v1/chat/completions", json={"pad": "x" * BODY_BYTES}),
        "unrouted": await rooted.post("/v1/responses", json={}),
    }
    shapes = {name: (a.status_code, sorted(a.json()["error"])) for name, a in answers.items()}
    openai = ["code", "message", "param", "type"]
    assert shapes == {
        "invalid": (400, openai),
        "too large": (413, openai),
        "unrouted": (404, openai),
    }


async def test_a_slash_twin_redirect_keeps_the_root_path(rooted: httpx.AsyncClient) -> None:
    moved = await rooted.get("/v1/models/", params={"a": "1"})
    assert moved.status_code == 307, moved.text
    assert moved.headers["location"] == "../models?a=1"  # under {ROOT} still


async def test_metrics_label_a_request_by_its_route_template(rooted: httpx.AsyncClient) -> None:
    labels = {"method": "GET", "route": "/v1/jobs/{job_id}", "status": "404"}
    before = REGISTRY.get_sample_value("conveyor_http_requests_total", labels) or 0
    assert (await rooted.get("/v1/jobs/j-root-path")).status_code == 404
    assert REGISTRY.get_sample_value("conveyor_http_requests_total", labels) == before + 1

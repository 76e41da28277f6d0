"""The console's pages at their edges, in-process on a real Valkey: a bug's 500 under /console
carries the console's security headers as its other answers do, and a job's error cut to
PREVIEW_BYTES says so, with its full size, as its inputs and outputs do."""

from __future__ import annotations

import re

import httpx
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.console.headers import SECURITY_HEADERS
from producer_api.console.job_browser import PREVIEW_BYTES
from shared.codec import dumps
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("console-edges-pages:")


def _settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")


async def test_a_bugs_500_under_the_console_carries_the_security_headers(redis_url: str) -> None:
    """The app's safety net answers a bug outside every middleware (Starlette's
    ServerErrorMiddleware): its 500 came without the CSP, nosniff and no-store."""
    app = create_app(_settings(redis_url))

    async def broken() -> None:
        raise RuntimeError("a bug in a console page")

    app.add_api_route("/console/broken", broken)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            answer = await client.get("/console/broken")
    assert answer.status_code == 500
    assert answer.json()["error"]["request_id"] == answer.headers["x-request-id"]
    for name, value in SECURITY_HEADERS.items():
        assert answer.headers.get(name) == value, (name, answer.headers)


async def test_a_jobs_cut_error_shows_its_size_and_that_it_was_cut(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The page cut a long error to PREVIEW_BYTES and said nothing: an operator read a
    message that ended mid-word as the whole of it."""
    message = "<b>" + "x" * (2 * PREVIEW_BYTES)
    error = dumps({"type": "EngineError", "message": message})
    async with app_client(create_app(_settings(redis_url))) as client:
        submitted = await client.post("/v1/jobs", json={"model": "identity", "inputs": {}})
        job_id = submitted.json()["id"]
        await aredis.hset(KEYS.job(job_id), mapping={"status": "failed", "error": error})
        page = await client.get(f"/console/jobs/{job_id}")
    assert page.status_code == 200
    heading = re.search(r"<h2>Error (.*?)</h2>", page.text)
    assert heading is not None, page.text
    assert heading[1] == f"<small>{len(error)} bytes, truncated</small>"
    assert "<b>" not in page.text  # the error is text, not markup

"""A producer serves its first request by the live routes, not config.yaml's split (the
producer in-process on a real Valkey, no worker). Its startup only scheduled the routes poll,
and a poll that had to seed a model without stored routes returned before reading any: a
restarted producer under load sent its first requests to `stable` while the live routes gave
`candidate` 100 %."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

import httpx
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.settings import Settings
from tests.conftest import REPO_ROOT

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"
IDENTITY = REPO_ROOT / "model_repository" / "identity"


def _repository(root: Path) -> Path:
    """`ab` (config.yaml: all to `stable`) and `identity`, a model with no stored routes yet."""
    for model in (TRAFFIC / "ab", IDENTITY):
        shutil.copytree(model, root / model.name)
    return root


async def test_the_first_requests_follow_the_live_routes(
    redis_url: str, aredis: aioredis.Redis, tmp_path: Path
) -> None:
    live = Routes({"stable": 0.0, "candidate": 100.0})
    await RouteStore(aredis, Keys()).put("ab", live, "test")
    settings = Settings(
        redis_url=redis_url,
        model_repository=_repository(tmp_path),
        auth="disabled",
        instance_id="first-load",
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:

            async def submit() -> str:
                body = {"model": "ab", "inputs": {}, "routing_key": uuid.uuid4().hex}
                response = await client.post("/v1/jobs", json=body)
                assert response.status_code == 202, response.text
                variant: str = response.json()["variant"]
                return variant

            first = await submit()  # the moment startup ends
            rest = await asyncio.gather(*(submit() for _ in range(20)))
    assert [first, *rest] == ["candidate"] * 21

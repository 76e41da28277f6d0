"""A tenant's file budget when an upload fails after its bytes were held (here the tenant's index
is of the wrong type, standing in for a Redis error or a timeout part-way through the store):
the client got a 5xx and no file id, yet the file's key stayed, unlisted, and its bytes stayed
held until it would have expired (a result TTL, a day by default), so the retry was refused
429 "delete files" with no file to delete."""

from __future__ import annotations

import uuid

import httpx
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.file_store import charged
from shared.keys import Keys
from shared.settings import Settings

LINE = b'{"custom_id": "a", "body": {"inputs": {"x": 1}}}\n'


async def test_an_upload_the_store_refused_gives_its_bytes_back(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    keys = Keys(f"edges-{uuid.uuid4().hex[:8]}:")
    budget = charged("a.jsonl", len(LINE))  # room for one file
    settings = Settings(
        redis_url=redis_url,
        auth="disabled",
        key_prefix=keys.prefix,
        max_file_bytes_per_tenant=budget,
    )
    app = create_app(settings)
    files = {"file": ("a.jsonl", LINE)}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            await aredis.set(keys.files_of("default"), "not an index")
            failed = await client.post("/v1/files", files=files, data={"purpose": "batch"})
            assert failed.status_code >= 500, failed.text
            assert await aredis.keys(keys.file("*")) == []  # nothing left stored unlisted
            await aredis.delete(keys.files_of("default"))
            retried = await client.post("/v1/files", files=files, data={"purpose": "batch"})
            assert retried.status_code == 200, retried.text

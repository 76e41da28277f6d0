"""A tenant's file budget when the reply to the hold of an upload's bytes is lost (a timeout
or a dropped connection after Redis ran it; here the real hold, then the timeout its caller
would see): the client got a 5xx and no file id, yet the bytes stayed held until the file would
have expired (a result TTL, a day by default), so the retry was refused 429 "delete files"
with no file to delete."""

from __future__ import annotations

import uuid

import httpx
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeout

from producer_api.app import create_app
from shared.file_store import FileStore, charged
from shared.keys import Keys
from shared.settings import Settings

LINE = b'{"custom_id": "a", "body": {"inputs": {"x": 1}}}\n'


def lose_the_first_reply(store: FileStore) -> None:
    """The store's first hold is run, and its caller sees a timeout."""
    hold = store.hold
    lost: list[bool] = []

    async def held_then_timed_out(*args: object, **kwargs: object) -> None:
        await hold(*args, **kwargs)  # type: ignore[arg-type]
        if not lost:
            lost.append(True)
            raise RedisTimeout("Timeout reading from socket")

    store.hold = held_then_timed_out  # type: ignore[method-assign]


async def test_an_upload_whose_hold_reply_was_lost_gives_its_bytes_back(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    keys = Keys(f"r15-{uuid.uuid4().hex[:8]}:")
    settings = Settings(
        redis_url=redis_url,
        auth="disabled",
        key_prefix=keys.prefix,
        max_file_bytes_per_tenant=charged("a.jsonl", len(LINE)),  # room for one file
    )
    app = create_app(settings)
    files = {"file": ("a.jsonl", LINE)}
    async with app.router.lifespan_context(app):
        lose_the_first_reply(app.state.conveyor.file_store)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            failed = await client.post("/v1/files", files=files, data={"purpose": "batch"})
            assert failed.status_code >= 500, failed.text
            held, _ = keys.file_budget_of("default")
            assert int(await aredis.hget(held, "total") or 0) == 0  # nothing left held
            retried = await client.post("/v1/files", files=files, data={"purpose": "batch"})
            assert retried.status_code == 200, retried.text

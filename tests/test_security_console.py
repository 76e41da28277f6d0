"""The console's edges against a hostile caller, in-process on a real Valkey: no client text
reaches a Redis key unchecked (README), which MONITOR shows."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.api_keys import SCOPES, ApiKeyStore, KeySpec
from shared.keys import Keys
from shared.settings import Settings

KEYS = Keys("security-console:")


@asynccontextmanager
async def _signed_in(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """A producer run in-process, and a client signed in to its console with an admin key."""
    key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec(tenant="ops", scopes=frozenset(SCOPES)))
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            form = (await client.get("/console/login")).text
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form)
            assert csrf is not None, form
            signed = await client.post("/console/login", data={"key": key, "csrf": csrf[1]})
            assert signed.status_code == 303, signed.text
            yield client


async def test_a_job_id_with_a_trailing_newline_reaches_no_key(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    digits = uuid.uuid4().hex
    sentinel = f"console-ids-{uuid.uuid4().hex}"
    seen: list[str] = []
    async with _signed_in(redis_url, aredis) as client, aredis.monitor() as monitor:
        for path in (f"/console/jobs/{digits}%0A", f"/console/jobs/{digits}%0A/tokens"):
            response = await client.get(path)
            assert response.status_code == 404, (path, response.text)
        await aredis.echo(sentinel)
        while sentinel not in (command := (await monitor.next_command())["command"]):
            seen.append(command)
    assert seen, "MONITOR saw the requests' own commands (the session's key)"
    assert not [command for command in seen if digits[-16:] in command]  # past its {tag}

"""A console's summary feeds count toward its key's cap of open streams, in-process on a real
Valkey: a token view did, a summary feed did not, so one browser tab per feed held a server
task and a socket each, without bound."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.api_keys import SCOPES, ApiKeyStore, KeySpec
from tests.test_security_console import KEYS, _client, _console, _log_in


async def _places(aredis: aioredis.Redis, key_id: str, count: int) -> None:
    """Until the key holds `count` open streams."""
    async with asyncio.timeout(1.5):
        while await aredis.zcard(KEYS.open_streams(key_id)) != count:
            await asyncio.sleep(0.01)


async def test_a_summary_feed_takes_a_place_under_the_keys_stream_cap(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    async with _console(redis_url, aredis) as (app, _), _client(app) as client:
        key, stored = await ApiKeyStore(aredis, KEYS).create(
            KeySpec(tenant="ops", scopes=frozenset(SCOPES), max_streams=1)
        )
        assert (await _log_in(client, key)).status_code == 303
        first = asyncio.create_task(client.get("/console/stream"))
        try:
            await _places(aredis, stored.key_id, 1)
            async with asyncio.timeout(1.5):  # a second feed opened would not end
                refused = await client.get("/console/stream")
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["type"] == "too_many_streams"
            assert refused.headers["retry-after"] == "1"
        finally:
            first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await _places(aredis, stored.key_id, 0)  # the closed feed gave its place back

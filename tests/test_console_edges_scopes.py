"""A console session holds only while its key holds the `read` scope the console needs to log in,
in-process on a real Valkey: the key stored again without it (a `submit`-only key) opened every
page and feed its session had, though a login with it is refused."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.api_keys import ApiKeyStore, KeySpec
from tests.test_security_console import KEYS, _client, _console, _log_in


async def test_a_session_whose_key_lost_the_read_scope_goes_to_the_login_page(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    async with _console(redis_url, aredis) as (app, key), _client(app) as client:
        assert (await _log_in(client, key)).status_code == 303
        assert (await client.get("/console/jobs")).status_code == 200
        await ApiKeyStore(aredis, KEYS).create(
            KeySpec(tenant="ops", scopes=frozenset({"submit"})), secret=key
        )
        for path in ("/console/jobs", "/console/stream"):
            async with client.stream("GET", path) as answer:  # a feed opened would not end
                assert (answer.status_code, answer.headers.get("location")) == (
                    303,
                    "/console/login",
                ), path
        assert (await _log_in(client, key)).status_code == 403  # as a login with it is refused

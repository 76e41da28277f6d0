"""Logging out of a console session whose key no longer holds `read`, in-process on a real
Valkey: the logout was sent to the login page as any request of such a session is, its session
left open and its cookie kept, so once the key held `read` again the cookie opened the console
as if nobody had logged out (README: logging out ends the session itself)."""

from __future__ import annotations

import re

import redis.asyncio as aioredis

from shared.api_keys import SCOPES, ApiKeyStore, KeySpec
from tests.test_security_console import KEYS, _client, _console, _log_in


async def test_a_logout_while_the_key_lacks_read_ends_the_session(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    store = ApiKeyStore(aredis, KEYS)
    async with _console(redis_url, aredis) as (app, key), _client(app) as client:
        assert (await _log_in(client, key)).status_code == 303
        csrf = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/console")).text)
        assert csrf is not None
        cookie = client.cookies["conveyor_console"]
        await store.create(KeySpec(tenant="ops", scopes=frozenset({"submit"})), secret=key)
        out = await client.post("/console/logout", data={"csrf": csrf[1]})
        assert (out.status_code, out.headers["location"]) == (303, "/console/login")
        await store.create(KeySpec(tenant="ops", scopes=frozenset(SCOPES)), secret=key)
        client.cookies.set("conveyor_console", cookie, path="/console")  # a copy of it
        again = await client.get("/console")
    assert (again.status_code, again.headers.get("location")) == (303, "/console/login")

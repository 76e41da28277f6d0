"""Logging in to the console again while signed in, in-process on a real Valkey: the new login
left the session its cookie named open server-side until its idle timeout, so a copy of the
old cookie (a proxy's log, another tab's) went on opening the console, as another user's
too once someone else logged in on that browser. A login ends the session it replaces, as
Django and Flask-Login do."""

from __future__ import annotations

import httpx
import redis.asyncio as aioredis

from shared.api_keys import SCOPES, ApiKeyStore, KeySpec
from tests.test_security_console import KEYS, _client, _console, _log_in

COOKIE = "conveyor_console"


async def _opens(client: httpx.AsyncClient, cookie: str) -> bool:
    """Whether `cookie` opens the Overview, sent as the only session cookie."""
    client.cookies.clear()
    client.cookies.set(COOKIE, cookie, path="/console")
    return (await client.get("/console")).status_code == 200


async def test_a_new_login_ends_the_session_it_replaces(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    other, _ = await ApiKeyStore(aredis, KEYS).create(
        KeySpec(tenant="other", scopes=frozenset(SCOPES))
    )
    async with _console(redis_url, aredis) as (app, key), _client(app) as client:
        assert (await _log_in(client, key)).status_code == 303
        first = client.cookies[COOKIE]
        assert (await _log_in(client, key)).status_code == 303  # the same key again
        second = client.cookies[COOKIE]
        assert (await _log_in(client, other)).status_code == 303  # another user
        third = client.cookies[COOKIE]
        assert len({first, second, third}) == 3
        assert not await _opens(client, first)
        assert not await _opens(client, second)
        assert await _opens(client, third)


async def test_a_session_refused_for_its_revoked_key_stays_ended_once_the_key_is_back(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A revoked key's session was refused but left open, renewed by each refused request: once
    the key was stored again (the development key, at a producer's start), a copy of its cookie
    opened the console though the operator had revoked the key to end it."""
    store = ApiKeyStore(aredis, KEYS)
    async with _console(redis_url, aredis) as (app, key), _client(app) as client:
        assert (await _log_in(client, key)).status_code == 303
        cookie = client.cookies[COOKIE]
        assert await _opens(client, cookie)
        record = await store.verify(key)
        assert record is not None
        assert await store.revoke(record.key_id)
        assert not await _opens(client, cookie)
        await store.create(KeySpec(tenant="ops", scopes=frozenset(SCOPES)), secret=key)
        assert not await _opens(client, cookie)

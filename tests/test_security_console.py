"""The console's edges against a hostile caller, in-process on a real Valkey: no client text
reaches a Redis key unchecked (README), which MONITOR shows."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI

from producer_api.app import build_state, create_app
from producer_api.auth import Principal
from producer_api.console.live_sessions import LiveSessions
from producer_api.console.login_throttle import bucket_of
from producer_api.console.session import ConsoleSession, still_open
from shared.api_keys import SCOPES, ApiKeyStore, KeySpec, key_id_of
from shared.keys import Keys
from shared.settings import Settings

KEYS = Keys("security-console:")


@asynccontextmanager
async def _console(
    redis_url: str, aredis: aioredis.Redis, **settings: Any
) -> AsyncIterator[tuple[FastAPI, str]]:
    """A producer run in-process, and an admin key for its console."""
    key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec(tenant="ops", scopes=frozenset(SCOPES)))
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, **settings))
    async with app.router.lifespan_context(app):
        yield app, key


def _client(app: FastAPI, address: str = "127.0.0.1") -> httpx.AsyncClient:
    """A client of the app that connects from `address`."""
    transport = httpx.ASGITransport(app=app, client=(address, 40_000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def _log_in(client: httpx.AsyncClient, key: str) -> httpx.Response:
    form = (await client.get("/console/login")).text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form)
    assert csrf is not None, form
    return await client.post("/console/login", data={"key": key, "csrf": csrf[1]})


@asynccontextmanager
async def _signed_in(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """A client signed in to an in-process producer's console with an admin key."""
    async with _console(redis_url, aredis) as (app, key), _client(app) as client:
        signed = await _log_in(client, key)
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


async def test_an_address_that_fails_too_many_logins_waits_out_the_minute(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The login form answered every guess at once, as often as it was posted. Logins whose key
    was found count for nothing; another address is not held back."""
    async with (
        _console(redis_url, aredis, console_login_failures_per_minute=3) as (app, key),
        _client(app, "10.0.0.1") as guesser,
        _client(app, "10.0.0.2") as other,
    ):
        for _ in range(4):
            assert (await _log_in(guesser, key)).status_code == 303
        for attempt in range(3):
            assert (await _log_in(guesser, f"cvk_guess{attempt}")).status_code == 401
        refused = await _log_in(guesser, key)  # the right key too, till the minute ends
        assert refused.status_code == 429, refused.text
        assert 0 < int(refused.headers["retry-after"]) <= 60
        assert "too many failed logins" in refused.text
        assert refused.headers["content-security-policy"]  # the form, as ever
        assert (await _log_in(other, key)).status_code == 303


@pytest.mark.parametrize(
    ("host", "bucket"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::"),  # one machine's /64 is one bucket
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::"),
        ("evil\n{x}", "unknown"),  # a proxy's header text reaches no key name
        (None, "unknown"),
    ],
)
def test_logins_are_counted_per_address(host: str | None, bucket: str) -> None:
    assert bucket_of(host) == bucket


async def test_a_session_unused_for_its_idle_timeout_ends(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A session cookie opened the console for its 12 hours, used or not: one left signed in on
    a shared machine, or a copy of it, still worked at night. Each use renews it."""
    async with (
        _console(redis_url, aredis, console_idle_timeout_s=600) as (app, key),
        _client(app) as client,
    ):
        assert (await _log_in(client, key)).status_code == 303
        [mark] = await aredis.keys(KEYS.console_session("*"))
        assert 0 < await aredis.ttl(mark) <= 600
        await aredis.expire(mark, 30)  # most of its idle time gone
        assert (await client.get("/console")).status_code == 200
        assert await aredis.ttl(mark) > 30  # used: it has its whole idle timeout again
        await aredis.delete(mark)  # as Redis drops it once the timeout passes unused
        ended = await client.get("/console")
        assert (ended.status_code, ended.headers["location"]) == (303, "/console/login")


async def test_a_session_holds_only_what_its_key_holds_now(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The session keeps the key's id, not its scopes: the key stored again with fewer scopes
    narrows it on its next request, and revoking the key ends it (README), as on `/v1`."""
    store = ApiKeyStore(aredis, KEYS)
    async with _console(redis_url, aredis) as (app, key), _client(app) as client:
        assert (await _log_in(client, key)).status_code == 303
        assert (await client.get("/console/dead-letters")).status_code == 200
        await store.create(KeySpec(tenant="ops", scopes=frozenset({"read"})), secret=key)
        assert (await client.get("/console/dead-letters")).status_code == 403
        await store.revoke(key_id_of(key))
        ended = await client.get("/console")
        assert (ended.status_code, ended.headers["location"]) == (303, "/console/login")


async def test_a_live_feed_ends_once_its_key_allows_less(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A feed kept the scopes and models its key had when it opened: an admin's view of every
    tenant's batches went on after the key was stored again read-only, for as long as the page
    stayed open. Its browser reopens it as the key now allows."""
    store = ApiKeyStore(aredis, KEYS)
    key, record = await store.create(KeySpec(tenant="ops", scopes=frozenset(SCOPES)))
    state = build_state(Settings(redis_url=redis_url, key_prefix=KEYS.prefix))
    sessions = LiveSessions(aredis, KEYS, idle_s=600)
    await sessions.open("feed", record.key_id)
    session = ConsoleSession(Principal.of(record, state.settings), "csrf", "feed")
    try:
        assert await still_open(state, sessions, session)
        await store.create(KeySpec(tenant="ops", scopes=frozenset({"read"})), secret=key)
        assert not await still_open(state, sessions, session)
    finally:
        await state.redis.aclose()


async def test_every_answer_under_the_console_carries_the_security_headers(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The console's routes added them to their answers and errors, but the router answers some
    before any route runs: a 405 for a console route asked with another method, a 404 for a
    path the console does not have."""
    async with _console(redis_url, aredis) as (app, _), _client(app) as client:
        answers = [
            await client.get("/console/logout"),
            await client.post("/console/jobs"),
            await client.get("/console/no-such-page"),
            await client.get("/console/login"),
        ]
    assert [answer.status_code for answer in answers] == [405, 405, 404, 200]
    for answer in answers:
        headers = answer.headers
        assert "frame-ancestors 'none'" in headers.get("content-security-policy", ""), headers
        assert (headers["x-frame-options"], headers["x-content-type-options"]) == (
            "DENY",
            "nosniff",
        )
        assert headers["referrer-policy"] == "no-referrer"

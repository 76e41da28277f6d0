"""Behind a reverse proxy (an ingress, a load balancer) every request reaches the producer from
the proxy's address: `conveyor up`'s server took X-Forwarded-For only from loopback, so one
guesser's failed console logins locked every operator out (one bucket, the proxy's).
CONVEYOR_FORWARDED_ALLOW_IPS names the peers whose X-Forwarded-For is believed; anyone else's
is ignored, so no client talks its way out of its own bucket. Through uvicorn's own proxy-header
handling, as `server_config` sets it up, on the in-process producer and a real Valkey."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError
from starlette.types import ASGIApp

from conveyor.producer_server import server_config
from producer_api.app import create_app
from shared.api_keys import SCOPES, ApiKeyStore, KeySpec
from shared.keys import Keys
from shared.settings import Settings
from tests.test_security_console import _log_in

KEYS = Keys("login-proxy:")
LIMIT = 2  # failed logins per address and minute: few, for a cheap test
INGRESS = ["10.0.0.0/8"]


@asynccontextmanager
async def _served(
    redis_url: str, aredis: aioredis.Redis, forwarded_allow_ips: list[str]
) -> AsyncIterator[tuple[ASGIApp, str]]:
    """The producer app as `conveyor up`'s server wraps it (`server_config`, then uvicorn's
    load), and an admin key for its console."""
    key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec(tenant="ops", scopes=frozenset(SCOPES)))
    settings = Settings(
        redis_url=redis_url,
        key_prefix=KEYS.prefix,
        console_login_failures_per_minute=LIMIT,
        forwarded_allow_ips=forwarded_allow_ips,
    )
    app = create_app(settings)
    config = server_config("127.0.0.1", 0, settings)
    config.app = app  # this app, on this test's Valkey, in place of the import string
    config.load()
    async with app.router.lifespan_context(app):
        yield config.loaded_app, key


def _from(app: ASGIApp, peer: str, forwarded_for: str) -> httpx.AsyncClient:
    """A client whose requests reach the server from `peer`, carrying `X-Forwarded-For`."""
    transport = httpx.ASGITransport(app=app, client=(peer, 40_000))
    headers = {"x-forwarded-for": forwarded_for}
    return httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers)


async def _fail_past_the_limit(client: httpx.AsyncClient) -> None:
    for attempt in range(LIMIT):
        assert (await _log_in(client, f"cvk_guess{attempt}")).status_code == 401
    assert (await _log_in(client, "cvk_guess")).status_code == 429


async def test_behind_a_trusted_proxy_each_client_has_its_own_bucket(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Both clients come through the ingress (10.0.0.7); the guesser's own X-Forwarded-For
    (leftmost, rotated each try) is not believed, only what the ingress appended."""
    async with _served(redis_url, aredis, INGRESS) as (app, key):
        async with _from(app, "10.0.0.7", "198.51.100.1, 203.0.113.5") as guesser:
            await _fail_past_the_limit(guesser)
            for spoof in ("198.51.100.2", "198.51.100.3"):
                guesser.headers["x-forwarded-for"] = f"{spoof}, 203.0.113.5"
                assert (await _log_in(guesser, key)).status_code == 429
        async with _from(app, "10.0.0.7", "203.0.113.9") as operator:
            signed = await _log_in(operator, key)
            assert signed.status_code == 303, signed.text


async def test_an_untrusted_peers_forwarded_for_is_ignored(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Loopback is no proxy here: its X-Forwarded-For names no client, so a new one per try
    escapes nothing."""
    async with (
        _served(redis_url, aredis, INGRESS) as (app, key),
        _from(app, "127.0.0.1", "203.0.113.5") as guesser,
    ):
        await _fail_past_the_limit(guesser)
        guesser.headers["x-forwarded-for"] = "203.0.113.6"
        assert (await _log_in(guesser, key)).status_code == 429


def test_the_setting_reaches_uvicorn(settings_env: Callable[..., None]) -> None:
    assert server_config("127.0.0.1", 0, Settings()).forwarded_allow_ips == ["127.0.0.1", "::1"]
    settings_env(CONVEYOR_FORWARDED_ALLOW_IPS=" 10.0.0.0/8, fd00::1 ,")
    config = server_config("127.0.0.1", 0, Settings())
    assert config.forwarded_allow_ips == ["10.0.0.0/8", "fd00::1"]
    settings_env(CONVEYOR_FORWARDED_ALLOW_IPS="*")
    assert Settings().forwarded_allow_ips == ["*"]


@pytest.mark.parametrize("value", ["ingress.local", "10.0.0.1/8", "*,10.0.0.1", "10.0.0.0/33"])
def test_an_entry_uvicorn_would_match_no_peer_with_is_refused(
    value: str, settings_env: Callable[..., None]
) -> None:
    """uvicorn keeps such an entry as text that no peer's address equals: the proxy went
    untrusted with nothing said."""
    settings_env(CONVEYOR_FORWARDED_ALLOW_IPS=value)
    with pytest.raises(ValidationError, match="forwarded_allow_ips"):
        Settings()

"""A console session's server-side record names the key it was opened for: the signed cookie
alone does not bind its key id to its nonce once the signing secret is known (the development
manifests' `dev-only-not-a-secret`, a leaked one)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import redis.asyncio as aioredis

from shared.api_keys import ApiKeyStore, KeySpec, key_id_of
from shared.codec import dumps
from tests.test_security_console import KEYS, _client, _console, _log_in

KNOWN_SECRET = "dev-only-not-a-secret"  # k8s/base/console-secret.yaml


def _forged(cookie: str, key_id: str) -> str:
    """The session cookie `cookie` names, its key id swapped for `key_id`, signed again with
    the known secret as SessionSigner signs."""
    body, _, _ = cookie.partition(".")
    payload = {**json.loads(base64.urlsafe_b64decode(body)), "k": key_id}
    payload["e"] = time.time() + 3600
    forged = base64.urlsafe_b64encode(dumps(payload)).decode()
    mac = hmac.new(KNOWN_SECRET.encode(), b"session|" + forged.encode(), hashlib.sha256)
    return f"{forged}.{mac.hexdigest()}"


async def test_a_session_opened_with_one_key_does_not_open_the_console_as_another(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A tenant's read-only session, its cookie re-signed to name an admin key's public id,
    opened the console as that admin (every tenant's jobs, dead letters, routes)."""
    reader, _ = await ApiKeyStore(aredis, KEYS).create(
        KeySpec(tenant="team-a", scopes=frozenset({"read"}))
    )
    async with (
        _console(redis_url, aredis, console_secret=KNOWN_SECRET) as (app, admin),
        _client(app) as client,
    ):
        assert (await _log_in(client, reader)).status_code == 303
        assert (await client.get("/console/dead-letters")).status_code == 403  # not an admin
        own = client.cookies["conveyor_console"]
        client.cookies.set("conveyor_console", _forged(own, key_id_of(admin)), path="/console")
        forged = await client.get("/console/dead-letters")
        assert (forged.status_code, forged.headers.get("location")) == (303, "/console/login")
        client.cookies.set("conveyor_console", own, path="/console")
        assert (await client.get("/console")).status_code == 200  # its own session stands

"""A refused console login looks its key up once: the refusal's reason and the login
throttle's forgiveness both come from that one read. It read the key's record twice (HGETALL
to refuse, HGETALL again to learn whether the key was found), doubling the Redis work each
guess costs; MONITOR counts the reads."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from shared.api_keys import ApiKeyStore, KeySpec, key_id_of
from tests.test_security_console import KEYS, _client, _console, _log_in


async def _lookups(aredis: aioredis.Redis, redis_url: str, presented: str) -> tuple[int, str]:
    """How many commands a refused login of `presented` sent that read its record, and the
    refusal page."""
    sentinel = f"console-login-{uuid.uuid4().hex}"
    record = KEYS.api_key(key_id_of(presented))
    seen = []
    async with (
        _console(redis_url, aredis) as (app, _),
        _client(app, "10.0.7.1") as client,
        aredis.monitor() as monitor,
    ):
        refused = await _log_in(client, presented)
        await aredis.echo(sentinel)
        while sentinel not in (command := (await monitor.next_command())["command"]):
            seen.append(command)
    assert refused.status_code == 401, refused.text
    assert refused.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    return sum(record in command for command in seen), refused.text


@pytest.mark.parametrize("kind", ["unknown", "revoked"])
async def test_a_refused_login_reads_its_key_once(
    redis_url: str, aredis: aioredis.Redis, kind: str
) -> None:
    presented = f"cvk_{uuid.uuid4().hex}"
    if kind == "revoked":
        store = ApiKeyStore(aredis, KEYS)
        await store.create(KeySpec(tenant="ops", scopes=frozenset({"read"})), presented)
        assert await store.revoke(key_id_of(presented))
    reads, page = await _lookups(aredis, redis_url, presented)
    assert reads == 1
    assert ("API key revoked" if kind == "revoked" else "unknown API key") in page

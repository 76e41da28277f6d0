"""A console login with a revoked or expired key is refused (401) but counts for nothing in the
address's login throttle, as README says ("a key that is found counts for nothing"): its
presenter holds the key's secret, no guess. Counted, a colleague's bookmarked login with a
revoked key locked their whole office's address out of the console for the minute."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from shared.api_keys import ApiKeyStore, KeySpec, key_id_of
from tests.test_security_console import KEYS, _client, _console, _log_in


async def test_a_revoked_or_expired_key_is_no_failed_login(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    store = ApiKeyStore(aredis, KEYS)
    revoked, _ = await store.create(KeySpec(tenant="ops", scopes=frozenset({"read"})))
    assert await store.revoke(key_id_of(revoked))
    expired, _ = await store.create(
        KeySpec(tenant="ops", scopes=frozenset({"read"}), expires_at=time.time() - 1)
    )
    async with (
        _console(redis_url, aredis, console_login_failures_per_minute=2) as (app, key),
        _client(app, "10.0.9.1") as office,
    ):
        for stale in (revoked, expired, revoked):
            refused = await _log_in(office, stale)
            assert refused.status_code == 401, refused.text
        assert "API key revoked" in refused.text  # refused as ever, and why
        signed = await _log_in(office, key)
        assert signed.status_code == 303, signed.text

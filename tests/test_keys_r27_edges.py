"""`conveyor keys` at its edges, on the real embedded Valkey: a key made to expire past year 9999
(`--expires-in 99999999d`, accepted) made `keys list` end with a traceback for every key, and so
did a record whose expiry reads as NaN or infinity (a hand edit `float` takes): such a record is
corrupt (README: refused as unknown, left out of the list), where a NaN expiry never came."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis
from click.testing import Result

from shared.api_keys import ApiKey, ApiKeyStore, key_id_of
from shared.keys import Keys
from shared.redis_client import connect
from tests.conftest import issue_key
from tests.test_keys_r21_rotate import keys_cli  # noqa: F401 (a fixture)


def _verified(redis_url: str, key: str) -> ApiKey | None:
    async def verify() -> ApiKey | None:
        client = connect(redis_url)
        try:
            return await ApiKeyStore(client, Keys()).verify(key)
        finally:
            await client.aclose()

    return asyncio.run(verify())


def test_list_shows_a_key_expiring_past_year_9999(
    keys_cli: Callable[..., Result],  # noqa: F811
) -> None:
    created = keys_cli("create", "--tenant", "acme", "--expires-in", "99999999d")
    assert created.exit_code == 0, created.output
    listed = keys_cli("list")
    assert listed.exit_code == 0, listed.output
    assert f"{key_id_of(created.stdout.strip())}\tacme" in listed.stdout
    assert "(Unix time)" in listed.stdout


def test_a_record_with_a_non_finite_number_is_refused_and_left_out_of_the_list(
    keys_cli: Callable[..., Result],  # noqa: F811
    redis_url: str,
    redis_client: redis.Redis,
) -> None:
    good = key_id_of(issue_key(redis_url, "acme", "read"))
    edited = {"expires_at": "nan", "weight": "inf"}
    keys = {field: issue_key(redis_url, "acme", "read") for field in edited}
    for field, key in keys.items():
        redis_client.hset(Keys().api_key(key_id_of(key)), field, edited[field])
    for as_json in ((), ("--json",)):
        listed = keys_cli("list", *as_json)
        assert listed.exit_code == 0, listed.output
        assert good in listed.stdout
        assert not any(key_id_of(key) in listed.stdout for key in keys.values())
    assert all(_verified(redis_url, key) is None for key in keys.values())  # 401: unknown

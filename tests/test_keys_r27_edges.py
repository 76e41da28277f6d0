"""`conveyor keys` at its edges, on the real embedded Valkey: a key expiring past year 9999
(`--expires-in 99999999d`, accepted then) made `keys list` end with a traceback for every key,
and so did a record whose expiry reads as NaN or infinity (a hand edit `float` takes): such a
record is corrupt (README: refused as unknown, left out of the list), where a NaN expiry never
came. A lifetime past a century is refused now."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
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
    redis_url: str,
    redis_client: redis.Redis,
) -> None:
    """A record written so (by a release that took such a lifetime, or by hand) still lists."""
    key = issue_key(redis_url, "acme", "read")
    redis_client.hset(Keys().api_key(key_id_of(key)), "expires_at", "1e12")
    listed = keys_cli("list")
    assert listed.exit_code == 0, listed.output
    assert f"{key_id_of(key)}\tacme" in listed.stdout
    assert "(Unix time)" in listed.stdout


@pytest.mark.parametrize(
    "lifetime", ["36501d", "876025h", "99999999999999999999d", "9" * 5000 + "s"]
)
def test_a_lifetime_past_a_century_is_refused(
    keys_cli: Callable[..., Result],  # noqa: F811
    lifetime: str,
) -> None:
    """`--expires-in 99999999999999999999d` made a key listed as expiring `8.64e+27 (Unix
    time)`; a lifetime of 5,000 digits was a traceback before the bound at 4,300 digits."""
    created = keys_cli("create", "--tenant", "acme", "--expires-in", lifetime)
    assert created.exit_code == 2, created.output
    assert "at most 36500d (100 years); leave --expires-in out" in created.stderr
    assert keys_cli("list").stdout == ""


def test_a_lifetime_of_a_century_is_taken(keys_cli: Callable[..., Result]) -> None:  # noqa: F811
    created = keys_cli("create", "--tenant", "acme", "--expires-in", "36500d")
    assert created.exit_code == 0, created.output
    assert "expires 2126-" in keys_cli("list").stdout


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

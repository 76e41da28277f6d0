"""`conveyor keys rotate` and `create` on a real Valkey. A rotation read the old key, then wrote
the new one: a revoke between the two still gave a working replacement of a revoked key, and
the store itself rotated an expired key. It is now one script that checks the old key where it
writes the new one. `--revoke-old-in` ends the old key after a grace period, and a new key (of
`create` or `rotate`) waits for CONVEYOR_REPLICA_ACKS replicas as a revocation does."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
import redis.asyncio as aioredis
from click.testing import Result

from shared.api_keys import ApiKeyStore, KeyNotRotatable, KeySpec, key_id_of
from shared.keys import Keys
from tests.conftest import issue_key
from tests.test_keys_r21_rotate import (
    _record,
    keys_cli,  # noqa: F401 (a fixture)
)

KEYS = Keys()
SPEC = KeySpec("acme", frozenset({"read"}), name="ci")


@pytest.fixture
async def store(aredis: aioredis.Redis) -> ApiKeyStore:
    return ApiKeyStore(aredis, KEYS)


async def test_a_key_revoked_after_it_was_read_is_not_rotated(
    store: ApiKeyStore, aredis: aioredis.Redis
) -> None:
    """The interleaving `keys rotate` met: its read of the old key, a revoke, its write."""
    _, old = await store.create(SPEC)
    assert await store.revoke(old.key_id)
    with pytest.raises(KeyNotRotatable, match="API key revoked"):
        await store.rotate(old, 0.0)
    assert await aredis.smembers(KEYS.api_key_index) == {old.key_id.encode()}


async def test_an_expired_key_is_not_rotated(store: ApiKeyStore, aredis: aioredis.Redis) -> None:
    _, old = await store.create(KeySpec("acme", SPEC.scopes, expires_at=time.time() - 1))
    with pytest.raises(KeyNotRotatable, match="API key expired"):
        await store.rotate(old, 0.0)
    assert await aredis.scard(KEYS.api_key_index) == 1


def test_rotate_revoke_old_in_ends_the_old_key_after_the_grace(
    keys_cli: Callable[..., Result],  # noqa: F811
    redis_url: str,
    redis_client: redis.Redis,
) -> None:
    old_id = key_id_of(issue_key(redis_url, "acme", "read"))
    before = time.time()
    rotated = keys_cli("rotate", old_id, "--revoke-old-in", "1h")
    assert rotated.exit_code == 0, rotated.output
    old = _record(redis_client, old_id)
    assert before + 3600 <= old.spec.expires_at <= time.time() + 3600
    assert old.refusal(time.time()) is None  # works on through the grace period
    assert old.refusal(old.spec.expires_at) == "API key expired"
    assert f"key id {old_id} works on until 20" in rotated.stderr
    new = _record(redis_client, key_id_of(rotated.stdout.strip()))
    assert new.spec.expires_at == 0 and new.limits_of == old_id


def test_rotate_revoke_old_in_never_lengthens_the_old_keys_life(
    keys_cli: Callable[..., Result],  # noqa: F811
    redis_url: str,
    redis_client: redis.Redis,
) -> None:
    expires_at = time.time() + 600
    old_id = key_id_of(issue_key(redis_url, "acme", "read", expires_at=expires_at))
    rotated = keys_cli("rotate", old_id, "--revoke-old-in", "30d")
    assert rotated.exit_code == 0, rotated.output
    assert _record(redis_client, old_id).spec.expires_at == expires_at


def test_rotate_without_revoke_old_in_leaves_the_old_key_alone(
    keys_cli: Callable[..., Result],  # noqa: F811
    redis_url: str,
    redis_client: redis.Redis,
) -> None:
    old_id = key_id_of(issue_key(redis_url, "acme", "read"))
    rotated = keys_cli("rotate", old_id)
    assert rotated.exit_code == 0, rotated.output
    assert _record(redis_client, old_id).spec.expires_at == 0
    assert "works on until revoked" in rotated.stderr


def test_rotate_refuses_a_bad_revoke_old_in(
    keys_cli: Callable[..., Result],  # noqa: F811
    redis_url: str,
    redis_client: redis.Redis,
) -> None:
    old_id = key_id_of(issue_key(redis_url, "acme", "read"))
    refused = keys_cli("rotate", old_id, "--revoke-old-in", "0s")
    assert refused.exit_code == 2
    assert "--revoke-old-in" in refused.stderr and "longer than 0" in refused.stderr
    assert redis_client.scard(KEYS.api_key_index) == 1


@pytest.mark.parametrize("rotating", [False, True])
def test_a_new_key_no_replica_confirmed_is_not_shown(
    keys_cli: Callable[..., Result],  # noqa: F811
    redis_url: str,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    rotating: bool,
) -> None:
    """The test Valkey has no replica: a key shown, then lost to a failover, was one its
    holder stored and the producer refused as unknown."""
    old_id = key_id_of(issue_key(redis_url, "acme", "read"))
    settings_env(CONVEYOR_REPLICA_ACKS="1", CONVEYOR_REDIS_TIMEOUT_S="0.5")
    args = ("rotate", old_id) if rotating else ("create", "--tenant", "acme")
    result = keys_cli(*args)
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert "the new key is not confirmed (fewer than 1 replicas confirmed" in result.stderr

"""On a real Valkey: `conveyor keys revoke` given the key itself (not its id) said "no such key"
for a key whose stored record is corrupt, which only its id could revoke; and the development
key `conveyor up` stores, with CONVEYOR_REPLICA_ACKS and no replica to confirm it, ended in a
ReplicaAckTimeout (`up` called it a lost Redis) rather than saying how to set up the stack."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import click
import pytest
import redis
import redis.asyncio as aioredis
from click.testing import Result

from conveyor.commands.keys import dev_key, dev_key_spec
from shared.api_keys import ApiKeyStore, key_id_of
from shared.keys import Keys
from shared.settings import Settings
from tests import test_keys_cli
from tests.conftest import issue_key

KEYS = Keys()
keys_cli = test_keys_cli.keys_cli  # `conveyor keys …` on the test's flushed Valkey


def test_revoke_by_the_key_takes_one_whose_record_is_corrupt(
    keys_cli: Callable[..., Result], redis_url: str, redis_client: redis.Redis
) -> None:
    key = issue_key(redis_url, "acme", "read")
    record = KEYS.api_key(key_id_of(key))
    redis_client.hset(record, "burst", "lots")  # the record no longer parses
    revoked = keys_cli("revoke", key)
    assert revoked.exit_code == 0, revoked.output  # was: no such key
    assert revoked.output == f"revoked {key_id_of(key)}\n"
    assert redis_client.hget(record, "revoked_at")


def _another_dev_key(redis_url: str) -> str:
    """A development key stored beside the one in use (an older `conveyor up`'s)."""

    async def store() -> str:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return (await ApiKeyStore(client, KEYS).create(dev_key_spec()))[0]
        finally:
            await client.aclose()

    return asyncio.run(store())


@pytest.mark.parametrize("older", [False, True], ids=["storing it", "revoking an older one"])
def test_a_dev_key_no_replica_confirms_is_one_clear_line(
    redis_url: str,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    tmp_path: Path,
    older: bool,
) -> None:
    key_file = tmp_path / "dev-key"
    settings = Settings(redis_url=redis_url)
    kept = dev_key(settings, key_file)  # stored while acks are off
    other = _another_dev_key(redis_url) if older else ""
    if not older:
        key_file.unlink()  # a fresh key is stored
    settings_env(CONVEYOR_REPLICA_ACKS="1", CONVEYOR_REDIS_TIMEOUT_S="0.5")
    with pytest.raises(click.ClickException) as refused:
        dev_key(settings, key_file)
    message = refused.value.message
    assert message.startswith("no replica confirmed the development key (")
    assert "set CONVEYOR_REPLICA_ACKS=0 for a single-node dev stack" in message
    assert kept not in message and (not other or other not in message)

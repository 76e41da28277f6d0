"""`conveyor keys list` shows when each key stops working, on a real Valkey: a key rotated with
`--revoke-old-in` said so nowhere but `--json`, so the plain list read it as working for ever
until the moment it failed."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import redis
from click.testing import Result

from shared.api_keys import ApiKey, key_id_of
from shared.keys import Keys
from tests.conftest import issue_key
from tests.test_keys_r21_rotate import keys_cli

__all__ = ["keys_cli"]  # the fixture, used here by name


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def test_list_shows_each_keys_expiry_and_an_expired_one(
    keys_cli: Callable[..., Result], redis_url: str, redis_client: redis.Redis
) -> None:
    old_id = key_id_of(issue_key(redis_url, "acme", "read", name="ci"))
    gone_at = time.time() - 60
    gone_id = key_id_of(issue_key(redis_url, "acme", "read", name="old", expires_at=gone_at))
    rotated = keys_cli("rotate", old_id, "--revoke-old-in", "24h")
    assert rotated.exit_code == 0, rotated.output
    new_id = key_id_of(rotated.stdout.strip())
    cutoff = ApiKey.from_fields(redis_client.hgetall(Keys().api_key(old_id))).spec.expires_at
    assert cutoff, "the rotation set the old key's expiry"

    listed = keys_cli("list")

    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert f"{old_id}\tacme\tread\t*\tactive\tci\texpires {_utc(cutoff)}" in lines, lines
    assert f"{new_id}\tacme\tread\t*\tactive\tci\tlimits of {old_id}" in lines, lines  # never
    expired = f"{gone_id}\tacme\tread\t*\texpired\told\texpired {_utc(gone_at)}"
    assert expired in lines, lines

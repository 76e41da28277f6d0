"""`conveyor keys rotate --revoke-old-in` whose write too few replicas confirm, on the real
embedded Valkey (it has no replica): the script that stores the new key also brought the old
key's end closer on the primary, yet the command only said the new key was not confirmed, so
the operator believed nothing had changed while the old key was set to stop working. It now
says until when the old key works, and a rerun keeps that end (never brings it closer again).
A rerun's new key took the grace for the old key's lifetime: a replacement of a key that never
expired stopped within the hour, with the key it replaced. The old key's own expiry is kept."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import redis
from click.testing import Result

from shared.api_keys import key_id_of
from tests.conftest import issue_key
from tests.test_keys_r21_rotate import (
    _record,
    keys_cli,  # noqa: F401 (a fixture)
)


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def test_an_unconfirmed_rotation_says_the_old_keys_end_and_a_rerun_keeps_it(
    keys_cli: Callable[..., Result],  # noqa: F811
    redis_url: str,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
) -> None:
    old_id = key_id_of(issue_key(redis_url, "acme", "read"))
    settings_env(CONVEYOR_REPLICA_ACKS="1", CONVEYOR_REDIS_TIMEOUT_S="0.5")
    failed = keys_cli("rotate", old_id, "--revoke-old-in", "1h")
    assert failed.exit_code == 1, failed.output
    assert failed.stdout == ""
    cut = _record(redis_client, old_id).spec.expires_at
    assert cut  # written on the primary all the same
    assert "the new key is not confirmed" in failed.stderr
    assert f"key id {old_id} works on until {_utc(cut)} all the same" in failed.stderr

    settings_env(CONVEYOR_REPLICA_ACKS="0")
    rerun = keys_cli("rotate", old_id, "--revoke-old-in", "1h")
    assert rerun.exit_code == 0, rerun.output
    assert _record(redis_client, old_id).spec.expires_at == cut  # not moved by the rerun
    assert f"key id {old_id} works on until {_utc(cut)}" in rerun.stderr
    assert _record(redis_client, key_id_of(rerun.stdout.strip())).spec.expires_at == 0


def test_a_second_rotation_keeps_the_old_keys_own_lifetime(
    keys_cli: Callable[..., Result],  # noqa: F811
    redis_client: redis.Redis,
) -> None:
    created = keys_cli("create", "--tenant", "acme", "--expires-in", "30d")
    old_id = key_id_of(created.stdout.strip())
    lifetime = _record(redis_client, old_id).spec.expires_at - time.time()
    for _ in range(2):  # the first new key lost (not stored by its holder): rotated again
        rotated = keys_cli("rotate", old_id, "--revoke-old-in", "1h")
        assert rotated.exit_code == 0, rotated.output
        new = _record(redis_client, key_id_of(rotated.stdout.strip()))
        assert abs(new.spec.expires_at - new.created_at - lifetime) < 60

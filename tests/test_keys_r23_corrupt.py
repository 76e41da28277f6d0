"""A key whose stored record does not parse (a field edited by hand, a partial write): every
request that presented it was a 500 with a traceback, `conveyor keys list` failed for every
key, and `conveyor keys revoke` could not revoke it. It is now refused as an unknown key, left
out of `list`, and revoked as any other."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from conveyor.cli import main
from producer_api.app import create_app
from shared.api_keys import key_id_of
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import issue_key

KEYS = Keys()


@pytest.fixture
def corrupt(redis_url: str, redis_client: redis.Redis) -> str:
    """A key (read scope) whose record's burst is no number."""
    key = issue_key(redis_url, "acme", "read")
    redis_client.hset(KEYS.api_key(key_id_of(key)), "burst", "lots")
    return key


def _keys_cli(
    redis_url: str, settings_env: Callable[..., None], tmp_path: Path
) -> Callable[..., Result]:
    settings_env(CONVEYOR_REDIS_URL=redis_url, CONVEYOR_STATE_DIR=str(tmp_path / "state"))
    return lambda *args: CliRunner().invoke(main, ["keys", *args])


def test_a_corrupt_key_is_refused_as_unknown(redis_url: str, corrupt: str) -> None:
    app = create_app(Settings(redis_url=redis_url, auth="enabled"))

    async def models() -> tuple[int, str]:
        async with app_client(app) as client:
            answer = await client.get("/v1/models", headers={"X-API-Key": corrupt})
            return answer.status_code, answer.json()["error"]["message"]

    assert asyncio.run(models()) == (401, "unknown API key")


def test_list_and_revoke_get_past_a_corrupt_key(
    redis_url: str,
    redis_client: redis.Redis,
    corrupt: str,
    settings_env: Callable[..., None],
    tmp_path: Path,
) -> None:
    keys_cli = _keys_cli(redis_url, settings_env, tmp_path)
    sound = key_id_of(issue_key(redis_url, "acme", "read"))
    listed = keys_cli("list")
    assert listed.exit_code == 0, listed.output
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == [sound]
    revoked = keys_cli("revoke", key_id_of(corrupt))
    assert revoked.exit_code == 0, revoked.output
    assert redis_client.hget(KEYS.api_key(key_id_of(corrupt)), "revoked_at")

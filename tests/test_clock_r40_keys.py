"""API keys and console sessions on Redis's clock (shared/redis_clock.py), as jobs' times are: on
each host's own, two producers a minute apart let a key (or a console session) live a minute
longer on one, and `conveyor keys`, run on an operator's laptop, wrote the laptop's time as a
key's `created_at`, `expires_at` and `revoked_at`. On a real Valkey; a skewed host is this
process's `time` read off by SKEW_S (the server's TIME is the real one)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from click.testing import CliRunner, Result

from conveyor.cli import main
from producer_api.app import create_app
from producer_api.console.session import SessionSigner
from shared.api_keys import ApiKeyStore, KeySpec
from shared.codec import as_text
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async
from tests.test_clock_r38_sweep import NEAR_S, SKEW_S, _adopted, _host_off, _read_off, _redis_s

KEYS = Keys("r40-clock:")
SCOPES = frozenset({"submit", "read"})


async def test_a_producer_behind_redis_refuses_a_key_expired_on_redis_clock(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended = await _redis_s(aredis) - SKEW_S / 2  # on Redis's clock, half the skew ago
    key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec("acme", SCOPES, expires_at=ended))
    _read_off(monkeypatch, -SKEW_S)  # the producer's host
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, instance_id="r40-clock")
    async with app_client(create_app(settings)) as client:
        await until_async(lambda: _adopted(-SKEW_S))  # its start's measure
        answer = await client.get("/v1/jobs/abc", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 401, answer.text
    assert "API key expired" in answer.text


async def test_a_console_session_lasts_its_age_on_redis_clock_on_a_host_ahead(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issued by a replica in step with Redis, read by one ahead (their shared secret): the
    session's age is Redis's, not cut short by the reader's clock."""
    signer = SessionSigner("s" * 32)
    cookie, nonce = signer.issue("0123456789abcdef", max_age_s=SKEW_S / 2)
    await _host_off(aredis, monkeypatch, SKEW_S)
    read = signer.read(cookie)
    assert read is not None and read[:2] == ("0123456789abcdef", nonce)


@pytest.fixture
def keys_cli(
    settings_env: Callable[..., None], redis_url: str, redis_client: redis.Redis
) -> Callable[..., Result]:
    """`conveyor keys …` run in this process (after `redis_client` flushed the database)."""
    settings_env(CONVEYOR_REDIS_URL=redis_url, CONVEYOR_KEY_PREFIX=KEYS.prefix)
    return lambda *args: CliRunner().invoke(main, ["keys", *args])


def _near_redis(client: redis.Redis, at: float, after_s: float = 0.0) -> None:
    seconds, micros = client.time()
    assert abs(at - (int(seconds) + int(micros) / 1e6 + after_s)) < NEAR_S, at


def _record(client: redis.Redis, key_id: str) -> dict[str, Any]:
    return {as_text(k): as_text(v) for k, v in client.hgetall(KEYS.api_key(key_id)).items()}


def test_a_laptop_behind_redis_writes_a_keys_times_on_redis_clock(
    keys_cli: Callable[..., Result], redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _read_off(monkeypatch, -SKEW_S)  # the operator's laptop
    made = keys_cli("create", "--tenant", "acme", "--expires-in", "1h", "--json")
    assert made.exit_code == 0, made.output
    key_id = json.loads(made.stdout)["key_id"]
    _near_redis(redis_client, float(_record(redis_client, key_id)["created_at"]))
    _near_redis(redis_client, float(_record(redis_client, key_id)["expires_at"]), 3600)
    revoked = keys_cli("revoke", key_id)
    assert revoked.exit_code == 0, revoked.output
    _near_redis(redis_client, float(_record(redis_client, key_id)["revoked_at"]))


def test_a_laptop_behind_redis_lists_a_key_expired_on_redis_clock_as_expired(
    keys_cli: Callable[..., Result], redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    seconds, _ = redis_client.time()
    made = keys_cli("create", "--tenant", "acme", "--expires-in", "1s", "--json")
    assert made.exit_code == 0, made.output
    key_id = json.loads(made.stdout)["key_id"]
    ended = int(seconds) - SKEW_S / 2  # on Redis's clock, half the skew ago
    redis_client.hset(KEYS.api_key(key_id), "expires_at", str(ended))
    _read_off(monkeypatch, -SKEW_S)
    listed = keys_cli("list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [json.loads(line)["state"] for line in listed.stdout.splitlines()] == ["expired"]

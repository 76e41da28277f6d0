"""`conveyor keys rotate` on a real Valkey, against a producer run in-process: a tenant rotated a
key by creating a second one and revoking the first, and while both worked each had a rate
bucket, an in-flight set and an open-streams set of its own, so the rotation doubled the
tenant's capacity. A rotated key now names the key whose limits it shares (`limits_of`, the
first of a chain), and the producer counts both keys against that one set."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from click.testing import CliRunner, Result
from fastapi import FastAPI

from conveyor.cli import main
from producer_api.app import create_app
from producer_api.auth.principal import Principal
from producer_api.errors import ConveyorError
from producer_api.state import ProducerState
from producer_api.stream_places import take_place
from shared.api_keys import ApiKey, ApiKeyStore, KeySpec, key_id_of
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import issue_key

KEYS = Keys("keys-r21-rotate:")
# a job on a partition no worker serves stays queued, holding its in-flight slot
STRANDED = {"model": "identity", "inputs": {"x": 1}, "ttl_s": 60}
# two requests at once, refilled about once a day: a third is refused within the test
SPEC = KeySpec(
    "acme", frozenset({"submit", "read"}), name="ci", rate_per_s=1e-5, burst=2, max_in_flight=1
)


@pytest.fixture
async def store(aredis: aioredis.Redis) -> ApiKeyStore:
    return ApiKeyStore(aredis, KEYS)


@pytest.fixture
def app(redis_url: str) -> FastAPI:
    return create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="enabled"))


@pytest.fixture
async def producer(app: FastAPI, store: ApiKeyStore) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database: the producer, auth on, served here."""
    async with app_client(app) as client:
        yield client


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_a_rotated_key_shares_its_old_keys_rate_bucket(
    producer: httpx.AsyncClient, store: ApiKeyStore
) -> None:
    old_key, old = await store.create(SPEC)
    new_key, _ = await store.rotate(old, 0.0)
    for _ in range(2):  # the old key spends the burst
        assert (await producer.get("/v1/models", headers=_as(old_key))).status_code == 200
    refused = await producer.get("/v1/models", headers=_as(new_key))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["type"] == "rate_limited"


async def test_a_rotated_key_shares_its_old_keys_in_flight_cap(
    producer: httpx.AsyncClient, store: ApiKeyStore, aredis: aioredis.Redis
) -> None:
    old_key, old = await store.create(KeySpec("acme", SPEC.scopes, max_in_flight=1))
    new_key, _ = await store.rotate(old, 0.0)
    accepted = await producer.post("/v1/jobs", json=STRANDED, headers=_as(new_key))
    assert accepted.status_code == 202, accepted.text
    # the slot a worker frees is the one taken: the set the job hash names is the shared one
    inflight = await aredis.hget(KEYS.job(accepted.json()["id"]), "inflight")
    assert inflight == KEYS.in_flight(old.key_id).encode()
    refused = await producer.post("/v1/jobs", json=STRANDED, headers=_as(old_key))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["type"] == "too_many_in_flight"


async def test_a_rotated_key_shares_its_old_keys_open_streams(
    app: FastAPI, producer: httpx.AsyncClient, store: ApiKeyStore
) -> None:
    _, old = await store.create(KeySpec("acme", SPEC.scopes, max_streams=1))
    _, new = await store.rotate(old, 0.0)
    state: ProducerState = app.state.conveyor
    assert await take_place(state, Principal.of(old, state.settings)) is not None
    with pytest.raises(ConveyorError) as refused:
        await take_place(state, Principal.of(new, state.settings))
    assert refused.value.status == 429


async def test_a_chain_of_rotations_shares_the_first_keys_limits(store: ApiKeyStore) -> None:
    _, first = await store.create(SPEC)
    _, second = await store.rotate(first, 0.0)
    third_key, third = await store.rotate(second, 0.0)
    stored = await store.verify(third_key)
    assert stored is not None and stored.limits_of == first.key_id == third.limits_id
    assert stored.spec == SPEC and first.limits_of == ""


@pytest.fixture
def keys_cli(
    redis_url: str, redis_client: redis.Redis, settings_env: Callable[..., None], tmp_path: Path
) -> Callable[..., Result]:
    """`conveyor keys …` run here on the test's flushed Valkey (no `conveyor up` state)."""
    settings_env(CONVEYOR_REDIS_URL=redis_url, CONVEYOR_STATE_DIR=str(tmp_path / "state"))
    return lambda *args: CliRunner().invoke(main, ["keys", *args])


def _record(client: redis.Redis, key_id: str) -> ApiKey:
    return ApiKey.from_fields(client.hgetall(Keys().api_key(key_id)))


def test_rotate_prints_a_new_key_with_the_old_spec_and_list_shows_the_link(
    keys_cli: Callable[..., Result], redis_url: str, redis_client: redis.Redis
) -> None:
    old_id = key_id_of(issue_key(redis_url, "acme", "read", name="ci", max_streams=3))
    rotated = keys_cli("rotate", old_id, "--expires-in", "30d")
    assert rotated.exit_code == 0, rotated.output
    new_key = rotated.stdout.strip()
    new, old = _record(redis_client, key_id_of(new_key)), _record(redis_client, old_id)
    assert new.matches(new_key) and new.limits_of == old_id and new.spec.expires_at
    assert new.spec.scopes == old.spec.scopes and new.spec.max_streams == 3
    lines = keys_cli("list").stdout.splitlines()
    ends = datetime.fromtimestamp(new.spec.expires_at, UTC).isoformat(timespec="seconds")
    assert f"{new.key_id}\tacme\tread\t*\tactive\tci\tlimits of {old_id}\texpires {ends}" in lines
    assert f"{old_id}\tacme\tread\t*\tactive\tci" in lines


def test_rotate_refuses_a_revoked_key(
    keys_cli: Callable[..., Result], redis_url: str, redis_client: redis.Redis
) -> None:
    """A replacement for a revoked (maybe leaked) key would bring its access back."""
    old_id = key_id_of(issue_key(redis_url, "acme", "read"))
    assert keys_cli("revoke", old_id).exit_code == 0
    refused = keys_cli("rotate", old_id)
    assert refused.exit_code == 1 and "revoked" in refused.output
    assert redis_client.scard(Keys().api_key_index) == 1

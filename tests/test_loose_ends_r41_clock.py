"""Redis's clock adopted before anything is stamped or judged on it: one shared measure-and-adopt
(`adopt_redis_clock`) for the CLI's one-off commands, which each had its own copy, and a
producer that judges a key's expiry on Redis's clock from its very first request (the lifespan
measures before the port opens, not only its `redis-clock` loop, a period later). On a real
Valkey; a skewed host is this process's `time` read off (tests/test_clock_r38_sweep.py)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.api_keys import ApiKeyStore, KeySpec
from shared.keys import Keys
from shared.redis_clock import CLOCK, adopt_redis_clock
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_clock_r38_sweep import NEAR_S, SKEW_S, _read_off, _redis_s

KEYS = Keys("r41-clock:")


async def test_adopting_redis_clock_corrects_this_hosts_by_its_skew(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _read_off(monkeypatch, SKEW_S)
    await adopt_redis_clock(aredis)
    assert abs(CLOCK.now() - await _redis_s(aredis)) < NEAR_S


async def test_a_producer_behind_redis_refuses_an_expired_key_at_its_first_request(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing awaited between the start and the request: no loop has measured yet."""
    ended = await _redis_s(aredis) - SKEW_S / 2  # on Redis's clock, half the skew ago
    key, _ = await ApiKeyStore(aredis, KEYS).create(
        KeySpec("acme", frozenset({"read"}), expires_at=ended)
    )
    _read_off(monkeypatch, -SKEW_S)  # the producer's host: the key has SKEW_S / 2 left there
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, instance_id="r41-clock")
    async with app_client(create_app(settings)) as client:
        answer = await client.get("/v1/jobs/abc", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 401, answer.text
    assert "API key expired" in answer.text

"""Shared fixtures: one real Redis-protocol server per test session (embedded Valkey unless
CONVEYOR_REDIS_URL points at one), and a clean keyspace per test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from conveyor.embedded_valkey import start_embedded_valkey

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("CONVEYOR_REDIS_URL")
    if external:
        yield external
        return
    server = start_embedded_valkey()
    try:
        yield server.connection_url
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    await client.flushdb()
    yield client
    await client.aclose()

"""One way to open a Redis client, so every process behaves the same under load and through a
server restart: a bounded pool that makes callers wait for a free connection (rather than fail
when a burst needs more), and commands that retry through dropped connections (`from_url`
alone gives connections that never retry, so the first request after a restart would fail)."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


def connect(url: str, max_connections: int = 64, name: str | None = None) -> aioredis.Redis:
    """A client whose commands retry a few times (jittered backoff capped at 1 s) before they
    raise; callers map what still fails to 503 or to their own backoff. `name` labels its
    connections in CLIENT LIST (a worker uses its consumer name)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        client_name=name,
        max_connections=max_connections,
        timeout=10,
        retry=Retry(ExponentialWithJitterBackoff(base=0.02, cap=1.0), retries=3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=15,
        socket_connect_timeout=2.0,
    )
    return aioredis.Redis(connection_pool=pool)

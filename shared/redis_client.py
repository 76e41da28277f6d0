"""One way to open a Redis client, so every process survives a server restart the same way:
`from_url` alone gives connections that never retry, and a stale pooled connection would then
fail the first request after the server comes back."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


def connect(url: str) -> aioredis.Redis:
    """A client whose commands retry through dropped connections (a few, with jittered backoff
    capped at 1 s) before they raise; callers map what still fails to 503 or their own backoff."""
    return aioredis.Redis.from_url(
        url,
        retry=Retry(ExponentialWithJitterBackoff(base=0.02, cap=1.0), retries=3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=15,
        socket_connect_timeout=2.0,
    )

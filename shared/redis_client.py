"""One way to open a Redis client, so every process behaves the same under load, through a
server restart and while Redis is frozen: a bounded pool that makes callers wait for a free
connection (rather than fail when a burst needs more), commands that retry through dropped
connections (`from_url` alone gives connections that never retry, so the first request after a
restart would fail), and socket, connect and pool-wait timeouts of `CONVEYOR_REDIS_TIMEOUT_S`,
so a Redis that stops answering is an error in seconds (the producer's 503), never a hang."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.settings import get_settings


def connect(
    url: str,
    max_connections: int = 64,
    name: str | None = None,
    *,
    blocks_ms: int | None = None,
    timeout_s: float | None = None,
) -> aioredis.Redis:
    """A client whose commands retry a few times through dropped connections (jittered backoff
    capped at 1 s) before they raise; callers map what still fails to 503 or to their own
    backoff. A timeout is not retried: it would multiply the wait on a frozen server.

    `name` labels its connections in CLIENT LIST (a worker uses its consumer name).
    `blocks_ms` is the longest BLOCK its commands use (default `CONVEYOR_BLOCK_MS`, what a
    worker's reads block for; 0 for a client that never blocks): the socket timeout is
    `timeout_s` (default `CONVEYOR_REDIS_TIMEOUT_S`) beyond it, so no blocking read is cut."""
    settings = get_settings()
    timeout = settings.redis_timeout_s if timeout_s is None else timeout_s
    block_s = (settings.block_ms if blocks_ms is None else blocks_ms) / 1000
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        client_name=name,
        max_connections=max_connections,
        timeout=timeout,
        retry=Retry(
            ExponentialWithJitterBackoff(base=0.02, cap=1.0),
            retries=3,
            supported_errors=(RedisConnectionError,),  # the default would retry timeouts too
        ),
        retry_on_error=[RedisConnectionError],
        health_check_interval=15,
        socket_connect_timeout=timeout,
        socket_timeout=timeout + block_s,
    )
    return aioredis.Redis.from_pool(pool)  # the client owns its pool: aclose() closes both

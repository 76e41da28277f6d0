"""`/metrics` bounds its read of the partition gauges: a Redis that stops answering without
closing its connections (frozen, overloaded, a host that drops packets) held every scrape for
the client's timeouts and retries, past Prometheus' scrape timeout, so the producer's own
counters went missing too, just when an outage made them matter. The scrape answers with the
gauges as last read, as it does while Redis is out of reach."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from conveyor.stack import Stack
from producer_api.app import create_app
from producer_api.metrics import api_router
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

PREFIX = "health-edges-r8-scrape:"
HANG_S = 5.0  # a scrape still waiting then waits on Redis (Prometheus gives up at 10 s)


async def test_a_scrape_answers_while_redis_is_frozen(
    redis_url: str,
    aredis: aioredis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings_env(CONVEYOR_REDIS_TIMEOUT_S="60")  # the client waits out the freeze by itself
    settings = Settings(redis_url=redis_url, key_prefix=PREFIX, auth="disabled")
    async with app_client(create_app(settings)) as client:
        await aredis.xadd(Keys(PREFIX).queue("identity", "default"), {"n": 1})  # a job waiting
        monkeypatch.setattr(api_router, "_last_refresh", 0.0)
        read = await client.get("/metrics")
        monkeypatch.setattr(api_router, "_last_refresh", 0.0)  # read again, from a frozen Redis
        # Redis holds what may write, the read's script for the waiting job's age among them
        await aredis.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
        try:
            async with asyncio.timeout(HANG_S):
                frozen = await client.get("/metrics")
        finally:
            await aredis.execute_command("CLIENT", "UNPAUSE")
    assert frozen.status_code == 200, frozen.text
    lag = 'conveyor_partition_lag{lane="online",model="identity",variant="default"} 1.0'
    assert lag in read.text
    assert lag in frozen.text  # as last read


async def test_a_backlog_read_of_a_frozen_redis_is_a_prompt_503(
    bare_stack: Stack, settings_env: Callable[..., None]
) -> None:
    """KEDA's metrics-api scaler gives up on `/metrics/backlog/…` after 3 s: a read that waited
    on a frozen Redis for the client's timeouts failed its poll as a timeout with nothing said;
    a 503 with Retry-After, within the bound, says why. A Valkey of the test's own, stopped."""
    settings_env(CONVEYOR_REDIS_TIMEOUT_S="60")
    settings = Settings(redis_url=bare_stack.redis_url, auth="disabled")
    pid = int(bare_stack.client().info("server")["process_id"])
    async with app_client(create_app(settings)) as client:
        assert (await client.get("/metrics/backlog/identity/default")).status_code == 200
        os.kill(pid, signal.SIGSTOP)
        try:
            async with asyncio.timeout(HANG_S):
                frozen = await client.get("/metrics/backlog/identity/default")
        finally:
            os.kill(pid, signal.SIGCONT)
    assert frozen.status_code == 503, frozen.text
    assert frozen.headers["Retry-After"] == "1"

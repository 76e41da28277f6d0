"""Leftovers of the clock and backlog work, on a real Valkey: a producer's start measures Redis's
clock once (its startup measured, then its `redis-clock` loop measured again at once), and a
worker's cost hash holds only what the backlog formula reads (an `updated_ms` nothing read)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.backlog import ServiceCost, read_backlogs
from shared.keys import Keys
from shared.model_repository import ModelConfig
from shared.settings import Settings
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.conftest import REPO_ROOT, own_valkey

KEYS = Keys("r39-cleanup:")
# A loop that measures as it starts sends its TIME at its first turn, milliseconds after the
# start: a stall here could only hide a second TIME, never add one.
SETTLE_S = 0.5


@pytest.fixture
def quiet_url() -> Iterator[str]:
    """A Valkey no other process talks to: MONITOR sees every client's commands server-wide."""
    with own_valkey() as url:
        yield url


async def test_a_producers_start_measures_redis_clock_once(quiet_url: str, tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "model_repository" / "identity", tmp_path / "identity")
    settings = Settings(
        redis_url=quiet_url, model_repository=tmp_path, auth="disabled", instance_id="r39"
    )
    app = create_app(settings)
    watcher = aioredis.Redis.from_url(quiet_url)
    times: list[dict[str, Any]] = []
    try:
        async with watcher.monitor() as monitor:
            watching = asyncio.create_task(_client_times(monitor, times))
            async with app.router.lifespan_context(app):
                await asyncio.sleep(SETTLE_S)
            watching.cancel()
    finally:
        await watcher.aclose()
    assert len(times) == 1, times


async def _client_times(monitor: Any, times: list[dict[str, Any]]) -> None:
    """Collect the TIME commands clients send (a script's own TIME, the queue ETA's, is not
    one: MONITOR shows it from `lua`)."""
    while True:
        command = await monitor.next_command()
        if command["command"].upper() == "TIME" and command["client_type"] != "lua":
            times.append(command)


async def test_a_workers_cost_hash_holds_what_the_backlog_reads(aredis: aioredis.Redis) -> None:
    beat = Heartbeat("r39-w", "host", 1, "serving", models=["m:default"])
    await WorkerRegistry(aredis, KEYS).publish(beat, {("m", "default"): ServiceCost(0.01, 2.0)})
    stored = await aredis.hgetall(KEYS.service_cost("m", "default"))
    assert stored == {b"seconds_per_unit": b"0.01", b"units_per_job": b"2"}
    # a hash an older worker wrote (with its `updated_ms`) reads the same
    await aredis.hset(KEYS.service_cost("m", "default"), "updated_ms", "1796640000000")
    config = ModelConfig(name="m", kind="batch", backend="identity")
    [backlog] = await read_backlogs(aredis, KEYS, [(config, "default")])
    assert (backlog.measured, backlog.seconds_per_unit) == (True, 0.01)

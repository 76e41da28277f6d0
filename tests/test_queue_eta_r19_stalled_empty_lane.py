"""A stalled partition (its worker beats, nothing finishes) floors every ETA at the stall, but
deadline admission only bounded the entries ahead: a bulk job on the partition's empty bulk
lane, nothing ahead of it, was admitted with a `ttl_s` shorter than the stall, its 202 showing
an ETA past its deadline, and expired unrun. On a real Valkey and a producer in this process;
the stall is set as in test_queue_eta_r17_stalled_partition.py: a serving heartbeat, online
entries that arrived 8 s ago, drained counters that stop 3 s ago."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import GROUP, Keys
from shared.settings import Settings
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.app_client import app_client
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
ONLINE = KEYS.queue("steady", "default")
PER_S = 10  # jobs the drained counters say finished each second before the stall
WAITING = 30


async def _stalled(client: aioredis.Redis) -> None:
    """`steady` with one serving worker that drained PER_S a second until 3 s ago, WAITING
    online entries that arrived 8 s ago still waiting, its bulk lane empty."""
    await client.xgroup_create(ONLINE, GROUP, id="0", mkstream=True)
    second = int(time.time())
    for index in range(WAITING):
        await client.xadd(ONLINE, {"n": index}, id=f"{(second - 8) * 1000}-{index}")
    for at in range(second - 10, second - 3):
        await client.set(KEYS.drained(ONLINE, at), PER_S)
    beat = Heartbeat("w-1", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(client, KEYS).publish(beat)


@asynccontextmanager
async def _producer(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A producer on the queue fixtures whose ETA has read the stall (its own refresher's first
    look may come later: this one does not wait for it)."""
    settings = Settings(
        redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled", model_repository=FIXTURES
    )
    app = create_app(settings)
    async with app_client(app) as client:
        await app.state.conveyor.queue_eta.refresh()
        yield client


def _bulk(**limit: float) -> dict[str, object]:
    return {"model": "steady", "inputs": {}, "priority": "bulk", **limit}


async def test_a_job_with_nothing_ahead_is_refused_when_the_stall_makes_it_late(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    await _stalled(aredis)
    async with _producer(redis_url) as api:
        response = await api.post("/v1/jobs", json=_bulk(ttl_s=1))
        assert response.status_code == 429, response.text  # was 202, its eta_ms past the ttl_s
        error = response.json()["error"]
        assert error["type"] == "deadline_unmeetable"
        assert error["eta_ms"] > 2_000  # the stall: nothing ahead
        assert int(response.headers["Retry-After"]) in range(1, 61)
        # an absolute deadline is refused as one with entries ahead is: no Retry-After
        response = await api.post("/v1/jobs", json=_bulk(deadline=time.time() + 1))
        assert response.status_code == 429, response.text
        assert "Retry-After" not in response.headers
        assert await aredis.xlen(KEYS.bulk_queue("steady", "default")) == 0
        # no deadline of its own: `steady`'s max_queue_time_s (600 s) outlasts the stall
        response = await api.post("/v1/jobs", json=_bulk())
        assert response.status_code == 202, response.text
        assert response.json()["eta_ms"] > 2_000

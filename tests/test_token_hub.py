"""Many clients following LLM token streams at once cost the producer one blocking Redis read
(its token hub), not a pooled connection each: 80 listeners on queued jobs, then every job is
cancelled and every stream ends with exactly its final event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from conveyor.stack import Stack
from tests.conftest import running_stack
from tests.test_llm_pipeline import sse_events

pytestmark = pytest.mark.slow
LISTENERS = 80  # more than the producer's Redis pool (64), so one connection each cannot be


@pytest.fixture(scope="module")
def producer_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A producer and no worker: every smollm2 job stays queued until cancelled."""
    with running_stack(tmp_path_factory.mktemp("token-hub"), CONVEYOR_AUTH="disabled") as stack:
        yield stack


def _blocked_producer_reads(r: redis.Redis) -> int:
    """Producer connections blocked in a read right now (CLIENT LIST flag `b`)."""
    clients: list[dict[str, Any]] = r.client_list()
    return sum(1 for c in clients if c["name"].startswith("producer-") and "b" in c["flags"])


async def _follow(client: httpx.AsyncClient, job_id: str, opened: asyncio.Event) -> list[Any]:
    async with client.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        assert response.status_code == 200
        opened.set()
        lines = [line async for line in response.aiter_lines()]
    return list(sse_events(lines))


async def _listen_then_cancel(stack: Stack, r: redis.Redis) -> tuple[list[list[Any]], int]:
    limits = httpx.Limits(max_connections=LISTENERS + 10)
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60, limits=limits) as client:
        body = {"model": "smollm2", "inputs": {"prompt": "hi"}}
        ids = [(await client.post("/v1/jobs", json=body)).json()["id"] for _ in range(LISTENERS)]
        opened = [asyncio.Event() for _ in ids]
        pairs = zip(ids, opened, strict=True)
        tasks = [asyncio.create_task(_follow(client, j, o)) for j, o in pairs]
        await asyncio.gather(*(event.wait() for event in opened))
        blocked = 0
        deadline = time.monotonic() + 3  # three rounds of every listener's 1 s wait
        while time.monotonic() < deadline:
            blocked = max(blocked, await asyncio.to_thread(_blocked_producer_reads, r))
            await asyncio.sleep(0.1)
        for job_id in ids:
            assert (await client.delete(f"/v1/jobs/{job_id}")).status_code == 200
        return list(await asyncio.gather(*tasks)), blocked


def test_eighty_listeners_share_one_blocking_read(producer_only: Stack) -> None:
    r = redis.Redis.from_url(producer_only.redis_url, decode_responses=True)
    try:
        streams, blocked = asyncio.run(_listen_then_cancel(producer_only, r))
    finally:
        r.close()
    assert blocked == 1, f"{blocked} producer connections blocked at once (the hub's: 1)"
    for events in streams:
        # no worker: each queued job is told so (`scaling`, `queued`) before its end
        assert [e["event"] for e in events][-1:] == ["final"]
        assert {e["event"] for e in events[:-1]} <= {"scaling", "queued"}, events
        assert '"status":"cancelled"' in events[-1]["data"].replace(" ", "")

"""Console pages drawn from what they are given at its worst: a worker whose clock runs ahead of
the producer's (its heartbeat read "-1 s ago"), and an ended batch listed after its files
expired (a result TTL under the ten minutes an ended batch is listed: its links answered 404)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI

from producer_api.app import create_app
from shared.codec import dumps
from shared.keys import Keys
from shared.settings import Settings
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.app_client import app_client

RESULT_TTL_S = 60
LINES = b'{"custom_id": "c0", "body": {"inputs": {"n": 0}}}\n'
# a model whose jobs may wait no longer than the short result TTL keeps them
BRIEF_MODEL = """\
kind: batch
backend: identity
input_schema: {type: object}
queue: {max_queue_time_s: 30}
variants:
  default: {weight: 100}
"""


async def test_a_heartbeat_from_a_clock_ahead_reads_no_negative_age(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    keys = Keys("console-clock-ahead:")
    await WorkerRegistry(aredis, keys).publish(Heartbeat("ahead-1", "h", 1, "serving"))
    await aredis.hset(keys.worker("ahead-1"), "last_beat", dumps(time.time() + 5))
    settings = Settings(redis_url=redis_url, key_prefix=keys.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        page = await client.get("/console/workers")
    assert page.status_code == 200 and "ahead-1" in page.text
    assert re.findall(r">(-?\d+) s ago<", page.text) == ["0"]


def _producer(redis_url: str, repository: Path, **settings: int) -> FastAPI:
    (repository / "brief").mkdir(exist_ok=True)
    (repository / "brief" / "config.yaml").write_text(BRIEF_MODEL)
    return create_app(
        Settings(
            redis_url=redis_url,
            key_prefix="console-expired-files:",
            auth="disabled",
            model_repository=str(repository),
            **settings,
        )
    )


async def _ended_batch(client: httpx.AsyncClient) -> str:
    """A batch cancelled at once: ended, its one line in its errors file."""
    headers = {"content-type": "application/jsonl"}
    created = await client.post("/v1/batches?model=brief", content=LINES, headers=headers)
    assert created.status_code == 202, created.text
    batch_id: str = created.json()["id"]
    assert (await client.post(f"/v1/batches/{batch_id}/cancel")).status_code == 200
    return batch_id


async def test_an_ended_batch_whose_files_expired_links_to_none(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its files are kept the result TTL at most: a producer started again with a shorter one
    (or a replica given one) lists for ten minutes a batch whose files went after one."""
    async with app_client(_producer(redis_url, tmp_path)) as client:
        batch_id = await _ended_batch(client)
    errors = f"/console/batches/{batch_id}/errors"
    app = _producer(redis_url, tmp_path, result_ttl_s=RESULT_TTL_S)
    async with app_client(app) as client:
        summaries = app.state.console.summaries
        await summaries.step()
        assert errors in (await client.get("/console/batches")).text  # kept: linked
        later_s = RESULT_TTL_S + 1
        clock, clock_ns = time.time, time.time_ns
        monkeypatch.setattr(time, "time", lambda: clock() + later_s)
        monkeypatch.setattr(time, "time_ns", lambda: clock_ns() + later_s * 10**9)
        await summaries.step()
        page = await client.get("/console/batches")
        assert batch_id in page.text and errors not in page.text
        assert (await client.get(errors)).status_code == 404  # what the link answered

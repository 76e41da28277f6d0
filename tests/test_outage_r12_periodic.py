"""A producer background loop whose step keeps failing otherwise than by Redis (here the live
routes poll reading a document that does not parse, on a real Valkey) runs on, and says so once
with its traceback, not once a step: the 100 ms routes poll logged ten tracebacks a second for
as long as the document stayed corrupt. A fault that comes back after a good step is told
again."""

from __future__ import annotations

import logging
import uuid

import pytest
import redis.asyncio as aioredis

from producer_api.periodic import Periodic
from shared.keys import Keys
from shared.route_store import RouteStore
from tests.conftest import until_async


async def test_a_step_failing_the_same_way_logs_its_traceback_once_and_runs_on(
    aredis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys(f"r12-periodic-{uuid.uuid4().hex[:6]}:")
    store = RouteStore(aredis, keys)
    steps: list[bool] = []  # whether each step read the routes whole

    async def step() -> None:
        steps.append(False)
        await store.get_many(["identity"])
        steps[-1] = True

    async def stepped(count: int) -> bool:
        return len(steps) >= count

    await aredis.hset(keys.routes("identity"), mapping={"doc": "{not json", "version": 1})
    loop = Periodic("live-routes", 0.01, step)
    caplog.set_level(logging.DEBUG, logger="producer_api.periodic")
    loop.start()
    try:
        await until_async(lambda: stepped(5), every=0.01)
        told_first = _tracebacks(caplog)
        await aredis.delete(keys.routes("identity"))
        await until_async(lambda: _last_whole(steps), every=0.01)
        await aredis.hset(keys.routes("identity"), mapping={"doc": "{not json", "version": 2})
        mended_at = len(steps)
        await until_async(lambda: stepped(mended_at + 5), every=0.01)
    finally:
        await loop.stop()
    assert told_first == 1, caplog.text
    assert _tracebacks(caplog) == 2, caplog.text


async def _last_whole(steps: list[bool]) -> bool:
    return bool(steps) and steps[-1]


def _tracebacks(caplog: pytest.LogCaptureFixture) -> int:
    return sum(
        1 for record in caplog.records if record.exc_info and "live-routes" in record.getMessage()
    )

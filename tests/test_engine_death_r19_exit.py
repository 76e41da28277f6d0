"""A worker whose generate engine died said so twice and asked to exit twice: the generate loop
logged the death critically, then the runtime logged the EngineDied it raised again, with a
traceback, and called `on_crash` once as serving ended and once more as its thread did. And an
engine found dead while its generations hung (never failed) left the exit waiting out the whole
drain for them, then aborting them, before the worker could go: the runtime's look now hands the
death to the partition's loop, which gives them up at once as for a failed call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis

from shared.job_states import JobStatus
from shared.keys import GROUP
from tests.conftest import until
from tests.test_worker_health_r18_engine_death_exit import (
    STREAM,
    CoreEngine,
    Worker,
    _enqueue,
    _statuses,
    core_worker,
)
from workers.engines.base import EngineDied, GenerateRequest, TokenChunk
from workers.runtime import consumer_runtime


class HangingCoreEngine(CoreEngine):
    """A CoreEngine whose generations hang once its core is gone, where CoreEngine's fail, and
    ignore an abort (recorded): as a request waits on a core that will never answer."""

    async def load(self) -> None:
        await super().load()
        self.aborts: list[str] = []

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        try:
            async for chunk in super().generate(request):
                yield chunk
        except RuntimeError:  # the dead core's failure, which this engine never reports
            await asyncio.Event().wait()

    async def abort(self, request_id: str) -> None:
        self.aborts.append(request_id)


Serving = Callable[[type[CoreEngine]], Worker]


@pytest.fixture
def serving(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Serving]:
    """Starts a worker on an engine class as tests/test_worker_health_r18_engine_death_exit.py
    does: a look every 20 ms, a death shown for 50 ms, a step every 300 ms, a drain of 0.5 s;
    on an empty keyspace (`redis_client`), where a pending entry would be read again."""
    monkeypatch.setattr(consumer_runtime, "ENGINE_CHECK_S", 0.02)
    monkeypatch.setattr(consumer_runtime, "DEATH_SHOWN_S", 0.05)
    started: list[Worker] = []

    def serve(engine: type[CoreEngine]) -> Worker:
        started.append(core_worker(tmp_path, redis_url, engine))
        return started[-1]

    try:
        yield serve
    finally:
        for worker in started:
            worker.runtime.stop()


def _criticals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.CRITICAL]


def _in_hand(redis_url: str, job_ids: list[str]) -> None:
    asyncio.run(_enqueue(redis_url, job_ids))
    running = [JobStatus.RUNNING] * len(job_ids)
    until(lambda: asyncio.run(_statuses(redis_url, job_ids)) == running, 30, every=0.05)


def test_a_failed_generation_on_a_dead_engine_is_logged_and_exits_once(
    redis_url: str,
    serving: Serving,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the generation's next step (300 ms) fails long before the runtime's look hands it over
    monkeypatch.setattr(consumer_runtime, "DEATH_SHOWN_S", 30.0)
    worker = serving(CoreEngine)
    _in_hand(redis_url, ["r19-in-hand"])
    worker.kill_core()
    assert isinstance(worker.ended_with(), EngineDied)
    [critical] = _criticals(caplog)
    assert "RuntimeError('the engine core died')" in critical  # the generate loop's line
    assert worker.crashes == ["crash"]


def test_an_idle_death_is_logged_and_exits_once(
    serving: Serving, caplog: pytest.LogCaptureFixture
) -> None:
    worker = serving(CoreEngine)
    worker.kill_core()
    assert isinstance(worker.ended_with(), EngineDied)
    assert len(_criticals(caplog)) == 1, _criticals(caplog)
    assert worker.crashes == ["crash"]


def test_a_dead_engines_hung_generations_are_given_up_at_once(
    redis_client: redis.Redis, redis_url: str, serving: Serving, caplog: pytest.LogCaptureFixture
) -> None:
    worker = serving(HangingCoreEngine)
    job_ids = ["r19-hung-1", "r19-hung-2"]
    _in_hand(redis_url, job_ids)
    worker.kill_core()
    assert isinstance(worker.ended_with(), EngineDied)
    engine = worker.engine
    assert isinstance(engine, HangingCoreEngine)
    assert engine.aborts == []  # no drain waited on them, then aborted them
    assert "abandoning unfinished generation" not in caplog.text
    pending = redis_client.xpending_range(STREAM, GROUP, "-", "+", 10)
    assert len(pending) == 2  # left to another worker's reclaim, as for a failed call
    assert len(_criticals(caplog)) == 1, _criticals(caplog)
    assert worker.crashes == ["crash"]

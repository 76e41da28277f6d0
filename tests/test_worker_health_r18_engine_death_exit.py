"""An idle worker whose generate engine died only answered `/healthz` 503: with no liveness
probe (`conveyor up`, `conveyor autoscale`) it never exited, and its model was served by no one
until a job reached it and failed a call. The runtime's look at its engines now ends it as the
engine contract says (`EngineDied`), its jobs in hand left pending for another worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.redis_client import connect
from shared.settings import Settings
from tests.conftest import until
from tests.paced_engine import PacedEngine
from workers.engines.base import EngineDied
from workers.runtime import consumer_runtime
from workers.runtime.consumer_runtime import ConsumerRuntime

KEYS = Keys("r18-death:")
STREAM = KEYS.queue("core", "default")


class CoreEngine(PacedEngine):
    """A paced engine with an engine-core process, as vLLM's: once that is gone, the engine is
    dead and its generations fail at their next step. Counts the looks at it, and records the
    threads that looked (tests/test_worker_health_r17_engine_death.py serves it too)."""

    async def load(self) -> None:
        await super().load()
        self.core = subprocess.Popen(["sleep", "600"])
        self.looks = 0
        self.asked_on: set[str] = set()

    def dead(self) -> bool:
        self.looks += 1
        self.asked_on.add(threading.current_thread().name)
        self._dead = self._dead or self.core.poll() is not None
        return self._dead

    async def close(self) -> None:
        self.core.kill()
        self.core.wait()


class Worker:
    """A started runtime serving `core` on CoreEngine in this process, and its crash calls."""

    def __init__(self, settings: Settings) -> None:
        self.crashes: list[str] = []
        self.runtime = ConsumerRuntime(settings, on_crash=lambda: self.crashes.append("crash"))
        self.runtime.start()

    @property
    def engine(self) -> CoreEngine:
        engine = self.runtime._engines[0]
        assert isinstance(engine, CoreEngine)
        return engine

    def kill_core(self) -> None:
        os.kill(self.engine.core.pid, signal.SIGKILL)

    def ended_with(self) -> BaseException | None:
        """The error serving ended on, once the consumer thread has ended (it must, soon)."""
        until(lambda: not self.runtime._thread.is_alive(), 30, every=0.02)
        assert self.runtime._serving is not None
        return self.runtime._serving.exception()


def core_worker(models: Path, redis_url: str, engine: type[CoreEngine]) -> Worker:
    """A worker (not started) serving model `core` on `engine`, a step every 300 ms, a stop
    draining for half a second."""
    (models / "core").mkdir()
    (models / "core" / "config.yaml").write_text(
        f"kind: generate\nbackend: {engine.__module__}:{engine.__name__}\n"
        "parameters:\n  step_ms: 300\n"
    )
    settings = Settings(
        redis_url=redis_url,
        key_prefix=KEYS.prefix,
        model_repository=models,
        models=["core"],
        gc_freeze=False,
        block_ms=50,
        shutdown_grace_s=10.5,
    )
    return Worker(settings)


@pytest.fixture
def worker(tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Worker]:
    """Looks at the engine every 20 ms and shows a death for 50 ms; jobs take a step every
    300 ms, and a stop drains for half a second."""
    monkeypatch.setattr(consumer_runtime, "ENGINE_CHECK_S", 0.02)
    monkeypatch.setattr(consumer_runtime, "DEATH_SHOWN_S", 0.05)
    started = core_worker(tmp_path, redis_url, CoreEngine)
    try:
        yield started
    finally:
        started.runtime.stop()


def test_an_idle_worker_whose_engine_died_exits(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the death shown long enough to be seen before the exit: in the fixture's 50 ms, a test
    # thread held off the CPU that long (a loaded machine) found the worker gone already
    monkeypatch.setattr(consumer_runtime, "DEATH_SHOWN_S", 0.5)
    worker.kill_core()
    until(lambda: worker.runtime.dead_engines, 30, every=0.01)
    assert worker.runtime.alive  # `/healthz` names the engine before the exit
    ended = worker.ended_with()
    assert isinstance(ended, EngineDied), ended
    assert "core:default" in str(ended)
    assert worker.crashes  # the worker exits, to be restarted
    assert worker.runtime.dead_engines == ("core:default",)


async def _enqueue(redis_url: str, job_ids: list[str]) -> None:
    client = connect(redis_url)
    try:
        store = JobStore(client, KEYS, 60)
        for job_id in job_ids:
            payload = {"inputs": {"prompt": "a long answer"}, "parameters": {"max_tokens": 100}}
            entry = RequestEntry(job_id, payload, now_ms())
            await store.create(entry, STREAM, {"model": "core", "variant": "default"})
    finally:
        await client.aclose()


async def _statuses(redis_url: str, job_ids: list[str]) -> list[JobStatus | None]:
    client = connect(redis_url)
    try:
        records = await JobStore(client, KEYS, 60).get_many(job_ids)
    finally:
        await client.aclose()
    return [None if record is None else record.status for record in records]


def test_a_dead_engines_jobs_in_hand_stay_pending(
    redis_client: redis.Redis, redis_url: str, worker: Worker
) -> None:
    job_ids = ["in-hand-1", "in-hand-2"]
    asyncio.run(_enqueue(redis_url, job_ids))
    running = [JobStatus.RUNNING] * 2
    until(lambda: asyncio.run(_statuses(redis_url, job_ids)) == running, 30, every=0.05)
    worker.kill_core()
    assert isinstance(worker.ended_with(), EngineDied)
    assert asyncio.run(_statuses(redis_url, job_ids)) == running  # neither failed nor written
    pending = redis_client.xpending_range(STREAM, GROUP, "-", "+", 10)
    assert len(pending) == 2  # left to another worker's reclaim
    assert {entry["consumer"] for entry in pending} == {worker.runtime.consumer.encode()}


def test_a_healthy_idle_engine_never_ends_the_worker(worker: Worker) -> None:
    looked = worker.engine.looks
    until(lambda: worker.engine.looks >= looked + 10, 30, every=0.02)
    assert worker.runtime.alive and worker.runtime.dead_engines == ()
    assert not worker.crashes

"""Micro-batches that run long, end to end on real workers: one read beside a long one is kept
claimed while it waits its turn, and one whose engine call never returns is handed back once it
has run `queue.max_run_s`, rather than kept claimed for as long as the worker lives. Also, on a
real Valkey without a stack: a long micro-batch's skipped entries are kept claimed with it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
import yaml

from conveyor.stack import Stack
from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig, ModelConfigError, ModelRepository, QueueLimits
from tests.conftest import REPO_ROOT, running_stack, until
from tests.fault_engine import FaultEngine
from tests.test_faults import _job, _wait_terminal
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import Delivery, StreamReader

KEYS = Keys("cv:")
FAULTY = REPO_ROOT / "tests" / "fixtures" / "model_repository" / "faulty" / "config.yaml"


def _repository(root: Path, **models: dict[str, Any]) -> Path:
    """A model repository of copies of the `faulty` test model (visibility timeout 2 s), one
    per keyword, each with those settings on top (its `queue`'s merged into faulty's)."""
    root.mkdir(exist_ok=True)
    for name, settings in models.items():
        config = yaml.safe_load(FAULTY.read_text())
        config |= {**settings, "queue": config["queue"] | settings.get("queue", {})}
        (root / name).mkdir()
        (root / name / "config.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.fixture(scope="module")
def long_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    wedged = {"queue": {"max_run_s": 1}}  # the shortest there is (MIN_RUN_CEILING_S)
    models = _repository(
        tmp_path_factory.mktemp("models"),
        faulty={},
        # touched every 1.7 s, taken over past 5 s: a worker or test stalled a second or two (a
        # loaded CI machine) lets no other worker take what a live one holds
        patient={"queue": {"visibility_timeout_s": 5}},
        wedged=wedged,
        staged={**wedged, "backend": "tests.fault_engine:StagedFaultEngine"},
    )
    with running_stack(
        tmp_path_factory.mktemp("long-runs"),
        CONVEYOR_MODEL_REPOSITORY=str(models),
        PYTHONPATH=str(REPO_ROOT),  # the custom backend lives in tests/
        CONVEYOR_AUTH="disabled",
        # a hung worker's exit is forced 2 s after, not 50 (the defaults: a grace of 30 s, then
        # 20 s for Celery's exit)
        CONVEYOR_SHUTDOWN_GRACE_S="1",
        CONVEYOR_FORCED_EXIT_MARGIN_S="1",
    ) as stack:
        yield stack


@pytest.fixture
def r(long_stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(long_stack.redis_url, decode_responses=True)
    yield client
    client.close()


def _submit(stack: Stack, model: str, inputs: dict[str, Any]) -> str:
    response = httpx.post(f"{stack.base_url}/v1/jobs", json={"model": model, "inputs": inputs})
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def _submit_bulk(stack: Stack, r: redis.Redis, model: str, inputs: dict[str, Any]) -> str:
    """One Batch API item (the bulk lane); returns its job id."""
    line = json.dumps({"custom_id": "c0", "body": {"inputs": inputs}}) + "\n"
    response = httpx.post(
        f"{stack.base_url}/v1/batches",
        params={"model": model},
        content=line,
        headers={"Content-Type": "application/jsonl"},
        timeout=60,
    )
    assert response.status_code == 202, response.text
    [job_id] = r.lrange(KEYS.batch_items(response.json()["id"]), 0, -1)
    return str(job_id)


def _history(job: dict[str, str]) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = json.loads(job.get("attempt_history", "[]"))
    return history


@pytest.mark.slow
def test_a_second_lanes_micro_batch_is_kept_claimed_while_the_first_runs(
    long_stack: Stack, r: redis.Redis
) -> None:
    """One blocking read returned both lanes; the bulk micro-batch's entries were first
    re-claimed only once the online one had run: past the visibility timeout another worker
    took the bulk job over and ran it, the first ran it again, and its record showed a false
    `crashed` attempt. The run is three visibility timeouts long."""
    online_id = _submit(long_stack, "patient", {"sleep_ms": 15_000})
    bulk_id = _submit_bulk(long_stack, r, "patient", {"n": 1})
    first = long_stack.start_worker("patient", name="both-lanes")  # reads both in one read
    time.sleep(0.5)
    long_stack.start_worker("patient", name="reclaimer")
    try:
        # the second worker came up while the first still ran the online job
        assert _job(r, online_id)["status"] == "running"
        _, bulk = _wait_terminal(r, [online_id, bulk_id], timeout=120)
    finally:
        long_stack.stop_processes(["both-lanes", "reclaimer"])
    assert bulk["status"] == "succeeded" and bulk["writes"] == "1", bulk
    assert [(a["outcome"], a["pid"]) for a in _history(bulk)] == [("succeeded", first)]


async def test_an_expired_job_read_beside_a_long_one_is_kept_claimed_with_it(
    aredis: aioredis.Redis,
) -> None:
    """A job past `max_queue_time` is not run, but written back only with its micro-batch's
    results; only the runnable entries were re-claimed meanwhile: past the visibility timeout
    another worker reclaimed the expired one, put a false `crashed` attempt naming this live
    worker on its record, and (a redelivery skips `max_queue_time`) ran it."""
    keys = Keys("long:")
    queue = QueueLimits(visibility_timeout_s=1, max_queue_time_s=60)
    backend = "tests.fault_engine:FaultEngine"
    config = ModelConfig(name="m", kind="batch", backend=backend, queue=queue)
    partition = Partition.of(keys, config, "default")
    store = JobStore(aredis, keys, ttl_s=60)
    for entry in (
        RequestEntry("stale", {"inputs": {}}, now_ms() - 120_000),  # waited past 60 s
        RequestEntry("slow", {"inputs": {"sleep_ms": 2_500}}, now_ms()),  # past the timeout
    ):
        await store.create(entry, partition.online, {"model": "m", "variant": "default"})
    events = JobEvents("redis://unused")
    reader = StreamReader(aredis, keys, partition.streams, "box-1-11")
    await reader.ensure_groups()
    [(stream, deliveries)] = await reader.wait(partition.streams, 10, 100)
    engine = FaultEngine(config, "default", "")
    engine.load()
    writer = ResultWriter(aredis, keys, 60, events, reader.consumer)
    lanes = LaneScheduler(
        partition, reader, Reclaimer(aredis, keys, partition, reader.consumer, 60, events)
    )
    loop = MicroBatchLoop(partition, lanes, reader, writer, engine, block_ms=100)
    rescuer = Reclaimer(aredis, keys, partition, "box-2-22", 60, events)

    running = asyncio.create_task(loop.process(stream, deliveries))
    taken: list[Delivery] = []
    while not running.done():  # the other worker's reclaims, all through the long run
        taken += await rescuer.reclaim(partition.online)
        await asyncio.sleep(0.1)
    await running
    await writer.close()

    assert [d.entry.job_id for d in taken if d.entry] == []
    for job_id, status in (("stale", "expired"), ("slow", "succeeded")):
        job = {k.decode(): v.decode() for k, v in (await aredis.hgetall(keys.job(job_id))).items()}
        assert job["status"] == status, job
        assert [a["outcome"] for a in _history(job) if a["outcome"] == "crashed"] == [], job


def _settled(r: redis.Redis, job_id: str) -> list[dict[str, Any]] | None:
    """The job's attempts once one crashed or the job ended, else None (not yet)."""
    job = _job(r, job_id)
    history = _history(job)
    crashed = any(attempt["outcome"] == "crashed" for attempt in history)
    ended = job.get("status") in {"succeeded", "failed", "cancelled", "expired"}
    return history if crashed or ended else None


@pytest.mark.slow
def test_a_micro_batch_past_max_run_s_is_handed_back(long_stack: Stack, r: redis.Redis) -> None:
    """An engine call that never returns (a wedged kernel, a deadlocked library) kept its jobs
    running for as long as the worker lived: it re-claimed them every third of the visibility
    timeout. Past `max_run_s` (1 s here) it stops, and the other worker takes the job over; a
    staged engine's pipeline alike. Both models run side by side: each hung worker's exit is
    forced only ~2 s on (grace and CONVEYOR_FORCED_EXIT_MARGIN_S), and they sit those out
    together."""
    models = ("wedged", "staged")
    names = {model: [f"{model}-{n}" for n in range(2)] for model in models}
    workers = [name for model in models for name in names[model]]
    for model in models:
        for name in names[model]:
            long_stack.spawn_worker(model, name=name)
    long_stack.wait_ready(*workers)
    try:
        jobs = {model: _submit(long_stack, model, {"sleep_ms": 600_000}) for model in models}
        histories: dict[str, list[dict[str, Any]]] = {
            model: until(lambda job_id=job_id: _settled(r, job_id), timeout=180, every=0.5)
            for model, job_id in jobs.items()
        }
        # the worker that hung exits, its engine's thread still asleep (Python waited for it)
        hung = {
            model: next(n for n in names[model] if long_stack.processes[n].pid == history[0]["pid"])
            for model, history in histories.items()
        }
        until(lambda: not any(map(long_stack.running, hung.values())), timeout=240, every=1)
        exit_codes = {model: long_stack.processes[name].returncode for model, name in hung.items()}
    finally:  # the other worker hangs on its rerun too: its forced exit is not waited for
        long_stack.stop_processes(workers, sig=signal.SIGKILL)
    for model, history in histories.items():
        assert history and history[0]["outcome"] == "crashed", (model, history)
        assert history[0]["error"]["type"] == "WorkerLost", (model, history)
        assert exit_codes[model] == os.EX_SOFTWARE, (model, exit_codes)


def test_max_run_s_is_a_non_negative_number_of_seconds(tmp_path: Path) -> None:
    unbounded = ModelRepository.load(
        _repository(tmp_path / "ok", unbounded={"queue": {"max_run_s": 0}})
    )
    assert unbounded.models["unbounded"].queue.max_run_s == 0
    with pytest.raises(ModelConfigError, match=r"queue\.max_run_s"):
        ModelRepository.load(_repository(tmp_path / "bad", wedged={"queue": {"max_run_s": -1}}))

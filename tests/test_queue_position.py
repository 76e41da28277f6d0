"""Queue position and ETA (issue #17, parts 1 and 2): a queued job's position falls as the jobs
ahead of it finish; the ETA of a steady load is within ±50% of when jobs really started, once
the drain rate is measured; the events stream says where a queued job stands, at most once a
second, and when no worker serves its partition; a deadline the ETA cannot meet is refused at
submit (429 deadline_unmeetable) and one it can is accepted, as is (with a deadline or none) a
job that would wait past `max_queue_time_s`; a rate outlives a pause while a worker serves; a
deadline that is negative or already past is refused (422) with nothing enqueued."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
import yaml

from conveyor.client import Client, RetryEvent
from conveyor.client.errors import APIError
from conveyor.stack import Stack
from producer_api.events.serving import QUEUED_EVERY_S
from shared import queue_eta
from shared.codec import RequestEntry
from shared.job_store import JobStore, stamp_ms
from shared.keys import GROUP, Keys, new_job_id
from shared.model_repository import ModelRepository
from shared.queue_eta import MIN_SPELL_S, REFRESH_S, Partition, QueueEta, StartBy
from shared.queue_position import RATE_WINDOW_S, PartitionLoad, QueuePositions
from shared.worker_registry import TTL_S
from tests.conftest import REPO_ROOT, running_stack, serve, until
from tests.test_cli import CONVEYOR
from tests.test_llm_pipeline import sse_events

pytestmark = pytest.mark.slow
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
HEARTBEAT_TTL_S = 3  # the workers' CONVEYOR_WORKER_HEARTBEAT_TTL_S
JOB_MS = 100  # one job per micro-batch, each sleeping this long: ~9 jobs/s with one worker
KEYS = Keys()
STEADY = KEYS.queue("steady", "default")
BRIEF = KEYS.queue("brief", "default")  # `steady` with a 3 s max_queue_time_s


def _repository(root: Path) -> Path:
    """The fixture repository with `steady`'s visibility timeout cut from 30 s to 6 s: the job a
    killed worker leaves in the stream (test_scaling_event_when_the_worker_dies_with_the_job_at_
    the_head) is reclaimed by the next worker as it starts, not half a minute after the kill.
    One worker serves `steady`, touching what it runs every 2 s: nothing else may reclaim it."""
    shutil.copytree(FIXTURES, root)
    config = root / "steady" / "config.yaml"
    settings = yaml.safe_load(config.read_text())
    settings["queue"]["visibility_timeout_s"] = 6
    config.write_text(yaml.safe_dump(settings))
    return root


@pytest.fixture(scope="module")
def queue_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The `steady` model with one worker; `idle` with none; `brief` with one, started beside
    steady's (a start is mostly one process importing) and waited for by the test that uses it."""
    with running_stack(
        tmp_path_factory.mktemp("queue-position"),
        CONVEYOR_AUTH="disabled",
        CONVEYOR_MODEL_REPOSITORY=str(_repository(tmp_path_factory.mktemp("queue") / "models")),
        PYTHONPATH=str(REPO_ROOT),  # the fault engine lives in tests/
        CONVEYOR_BLOCK_MS="100",  # a worker notices a stop once its read's block ends
        # a killed worker's record expires HEARTBEAT_TTL_S after its last beat, not 10 s
        CONVEYOR_WORKER_HEARTBEAT_S="0.5",
        CONVEYOR_WORKER_HEARTBEAT_TTL_S=str(HEARTBEAT_TTL_S),
        workers=("steady",),
    ) as stack:
        stack.spawn_worker("brief")
        yield stack


@pytest.fixture
def api(queue_stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=queue_stack.base_url, timeout=30) as client:
        yield client


@pytest.fixture
def store(queue_stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(queue_stack.redis_url, decode_responses=True)
    yield client
    client.close()


def _job(model: str = "steady", **extra: Any) -> dict[str, Any]:
    return {"model": model, "inputs": {"sleep_ms": JOB_MS}, **extra}


def _submit(api: httpx.Client, count: int) -> list[dict[str, Any]]:
    accepted = []
    for _ in range(count):
        response = api.post("/v1/jobs", json=_job())
        assert response.status_code == 202, response.text
        accepted.append(response.json())
    return accepted


def _drained(store: redis.Redis, stream: str = STEADY) -> None:
    until(lambda: store.xlen(stream) == 0, timeout=60)


def _measured(
    api: httpx.Client, model: str = "steady", backlog: int = 10, admits: bool = False
) -> None:
    """Wait until the producer knows the drain rate: a 202 behind a backlog carries an ETA, or
    deadline admission refuses. `admits`: until admission weighs deadlines, which waits for the
    workers' capacity, measured only once a refresh saw work waiting (an ETA may come from the
    window's rate before that: a job the test meant to be refused was then accepted)."""
    probe = _job(model, ttl_s=0.05) if admits else _job(model)

    def unmeetable(response: httpx.Response) -> bool:
        return bool(response.json()["error"]["type"] == "deadline_unmeetable")

    def waiting() -> bool:
        """Work waiting for the next refresh to see. True once admission refuses some of it: a
        slow worker (a busy machine) measured below `brief`'s 3 s of work for the backlog."""
        for _ in range(backlog):
            response = api.post("/v1/jobs", json=_job(model))
            if admits and response.status_code == 429:
                return unmeetable(response)
            assert response.status_code == 202, response.text
        return False

    def known() -> bool:
        for _ in range(3):  # up to a job behind another (at the head an ETA shows no rate)
            response = api.post("/v1/jobs", json=probe)
            if response.status_code == 429:
                return unmeetable(response)
            job = response.json()
            if job["queue_position"] > 0 and not admits:
                return job["eta_ms"] is not None
        return admits and waiting()  # work waiting again for the next refresh to see

    if not waiting():
        until(known, timeout=30, every=0.5)


def test_position_falls_as_the_jobs_ahead_finish(api: httpx.Client, store: redis.Redis) -> None:
    _drained(store)
    accepted = _submit(api, 15)
    positions = [job["queue_position"] for job in accepted]
    assert positions[-1] >= 10 and positions == sorted(positions), positions
    last = accepted[-1]["id"]
    seen: list[int] = []

    def started() -> bool:
        job = api.get(f"/v1/jobs/{last}").json()
        if job["status"] != "queued":
            return True
        seen.append(job["queue_position"])
        return False

    until(started, timeout=30, every=0.05)
    assert seen == sorted(seen, reverse=True), seen  # never rises
    # it fell most of the way to the head (how near depends on how fast the polls came)
    assert len(set(seen)) >= 5 and seen[-1] <= positions[-1] // 2, seen
    assert api.get(f"/v1/jobs/{last}", params={"wait": 30}).json()["status"] == "succeeded"
    done = api.get(f"/v1/jobs/{last}").json()
    assert "queue_position" not in done and "eta_ms" not in done


def test_a_wait_that_runs_out_answers_where_the_job_stands(
    api: httpx.Client, store: redis.Redis
) -> None:
    """A submit-and-wait whose wait ran out answered 202 `queued` whatever the job was doing;
    now it says what a GET then would: queued with its position, or running."""
    _drained(store)
    # ten ahead: with five, a machine slow enough to take 300 ms over six submits had drained
    # three of them (position 2)
    _submit(api, 10)
    body = {"inputs": {"sleep_ms": JOB_MS}}
    behind = api.post("/v1/models/steady/predict", params={"timeout": 0.05}, json=body)
    assert behind.status_code == 202, behind.text
    queued = behind.json()
    assert queued["status"] == "queued" and queued["queue_position"] >= 3, queued
    assert "eta_ms" in queued and queued["urls"]["self"].endswith(queued["id"])
    _drained(store)
    slow = _job(inputs={"sleep_ms": 3_000})  # well past the wait, however slow the machine
    answer = api.post("/v1/jobs", params={"wait": 1.5}, json=slow)
    assert answer.status_code == 202, answer.text
    running = answer.json()
    assert running["status"] == "running" and "queue_position" not in running, running
    assert api.get(running["urls"]["self"], params={"wait": 30}).json()["status"] == "succeeded"


async def _enqueued_replying_to_nobody(
    redis_url: str, inputs: dict[str, Any], model: str = "steady", count: int = 1
) -> list[str]:
    """Jobs as a dead letter's replay enqueues them: no producer's reply channel, no admission."""
    client = aioredis.Redis.from_url(redis_url)
    store, fields = JobStore(client, KEYS, 600), {"model": model, "variant": "default"}
    entries = [
        RequestEntry(new_job_id(model, "default"), {"inputs": inputs}, stamp_ms())
        for _ in range(count)
    ]
    for entry in entries:
        await store.create(entry, KEYS.queue(model, "default"), fields)
    await client.aclose()
    return [entry.job_id for entry in entries]


def test_a_long_poll_ends_with_a_job_that_has_no_reply_channel(
    api: httpx.Client, store: redis.Redis, queue_stack: Stack
) -> None:
    """Nothing publishes the end of a job no producer submitted (a dead letter's replay, a
    batch's line): its long-poll sat out the whole wait, though the job ended in a second."""
    _drained(store)
    [job_id] = asyncio.run(_enqueued_replying_to_nobody(queue_stack.redis_url, {"sleep_ms": 1_000}))
    answer = api.get(f"/v1/jobs/{job_id}", params={"wait": 60}, timeout=20)
    assert answer.status_code == 200 and answer.json()["status"] == "succeeded", answer.text


def test_a_keyed_submit_waits_as_one_without_a_key_does(
    api: httpx.Client, store: redis.Redis
) -> None:
    """`?wait` was ignored when an Idempotency-Key came with it: a 202 at once, though the job
    ended within the wait, while the key's retry did wait and answered 200."""
    _drained(store)
    headers = {"Idempotency-Key": f"wait-{uuid.uuid4().hex}"}
    first = api.post("/v1/jobs", params={"wait": 30}, json=_job(), headers=headers)
    assert first.status_code == 200 and first.json()["status"] == "succeeded", first.text
    again = api.post("/v1/jobs", params={"wait": 30}, json=_job(), headers=headers)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text


def test_a_keyed_repeat_waits_as_its_first_request_did(
    api: httpx.Client, store: redis.Redis
) -> None:
    """A repeat of a keyed `?wait` submit (its 202 was lost) answered 200 with the job still
    running: a client that takes 200 for finished read an unfinished job as final."""
    _drained(store)
    headers = {"Idempotency-Key": f"repeat-{uuid.uuid4().hex}"}
    slow = _job(inputs={"sleep_ms": 3_000})  # well past the waits, however slow the machine
    first = api.post("/v1/jobs", params={"wait": 0.3}, json=slow, headers=headers)
    assert first.status_code == 202, first.text
    again = api.post("/v1/jobs", params={"wait": 0.3}, json=slow, headers=headers)
    assert again.status_code == 202, again.text
    repeated = again.json()
    assert repeated["id"] == first.json()["id"] and repeated["status"] in ("queued", "running")
    assert repeated["urls"]["self"].endswith(repeated["id"])
    ended = api.post("/v1/jobs", params={"wait": 30}, json=slow, headers=headers)
    assert ended.status_code == 200 and ended.json()["status"] == "succeeded", ended.text
    _drained(store)


def test_a_retry_past_its_deadline_answers_with_the_job_it_was_accepted_as(
    api: httpx.Client, store: redis.Redis
) -> None:
    """A retry (the 202 was lost) sent once the deadline had passed was refused 422 `already
    past`, though the job it repeats was accepted and ran."""
    _drained(store)
    headers = {"Idempotency-Key": f"late-{uuid.uuid4().hex}"}
    body = _job(deadline=time.time() + 1.0)
    accepted = api.post("/v1/jobs", json=body, headers=headers)
    assert accepted.status_code == 202, accepted.text
    until(lambda: time.time() > body["deadline"])
    again = api.post("/v1/jobs", json=body, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == accepted.json()["id"], again.text
    refused = api.post("/v1/jobs", json=body)  # no key: nothing to repeat
    assert refused.status_code == 422 and "already past" in refused.text
    _drained(store)


ETA_TRIES = 3  # measurements of the ETA error, the first within bounds passing


def test_eta_error_on_a_steady_load(api: httpx.Client, store: redis.Redis) -> None:
    """Bursts of 10 jobs a second for 8 s (a little over what the worker drains, so a backlog
    stands throughout); each job's ETA at its 202 against its real wait (started - created),
    for jobs submitted after the first 5 s (the rate window full) that waited at least 0.5 s.
    Measured up to ETA_TRIES times: on a shared machine (the other xdist worker's processes) the
    worker's drain rate may fall mid-measurement, which no ETA from a measured rate foresees
    (median -52 % once, every job waiting longer than its ETA); an ETA method that is wrong
    misses every time."""
    figures = []
    for _ in range(ETA_TRIES):
        median, mean_abs = _eta_errors(api, store)
        figures.append((median, mean_abs))
        if abs(median) <= 0.5 and mean_abs <= 0.5:
            return
    pytest.fail(f"ETA error (median, mean |error|) out of ±50 % in every try: {figures}")


def _eta_errors(api: httpx.Client, store: redis.Redis) -> tuple[float, float]:
    """One measurement: the median ETA error and the mean absolute one, printed."""
    _drained(store)
    start = time.monotonic()
    jobs: list[tuple[float, dict[str, Any]]] = []
    for second in range(8):
        jobs += [(time.monotonic() - start, job) for job in _submit(api, 10)]
        time.sleep(max(0.0, start + second + 1 - time.monotonic()))
    errors = []
    for at, accepted in jobs:
        done = api.get(f"/v1/jobs/{accepted['id']}", params={"wait": 60}).json()
        assert done["status"] == "succeeded", done
        waited_ms = (done["timings"]["started"] - done["timings"]["created"]) * 1000
        if at >= 5 and waited_ms >= 500:
            assert accepted["eta_ms"] is not None, accepted
            errors.append((accepted["eta_ms"] - waited_ms) / waited_ms)
    assert len(errors) >= 15, errors
    median = statistics.median(errors)
    mean_abs = statistics.fmean(abs(e) for e in errors)
    print(
        f"\nETA error over {len(errors)} warm jobs: median {median:+.1%}, mean |error| "
        f"{mean_abs:.1%}, range {min(errors):+.1%} to {max(errors):+.1%}"
    )
    return median, mean_abs


def test_a_deadline_the_eta_cannot_meet_is_refused(api: httpx.Client, store: redis.Redis) -> None:
    _drained(store)
    _measured(api, admits=True)
    _submit(api, 30)  # ~3 s of jobs ahead (~9 a second), whatever drained meanwhile
    before = store.xlen(STEADY), store.get(KEYS.added(STEADY))
    response = api.post("/v1/jobs", json=_job(ttl_s=0.2))
    assert response.status_code == 429, response.text
    assert int(response.headers["Retry-After"]) in range(1, 61)
    error = response.json()["error"]
    assert error["type"] == "deadline_unmeetable" and error["eta_ms"] > 200, error
    assert store.get(KEYS.added(STEADY)) == before[1] and store.xlen(STEADY) <= before[0]
    # an absolute deadline nears as fast as the queue drains: no Retry-After, and the SDK
    # raises at once (it retried the same request to the deadline, then got a 422)
    retries: list[RetryEvent] = []
    with (
        Client(str(api.base_url), on_retry=retries.append) as client,
        pytest.raises(APIError) as absolute,
    ):
        # ~2.5 s of jobs still ahead; a second leaves the request time to arrive (422 if late)
        client.submit("steady", {"sleep_ms": JOB_MS}, deadline=time.time() + 1.0)
    assert absolute.value.status == 429 and retries == [], retries
    assert absolute.value.type == "deadline_unmeetable" and "later deadline" in str(absolute.value)
    raw = api.post("/v1/jobs", json=_job(deadline=time.time() + 1.0))
    assert raw.status_code == 429 and "Retry-After" not in raw.headers, raw.text
    assert raw.headers["x-should-retry"] == "false"  # nor do SDKs that retry 429s by default
    meetable = api.post("/v1/jobs", json=_job(deadline=time.time() + 120))
    assert meetable.status_code == 202, meetable.text
    job = api.get(f"/v1/jobs/{meetable.json()['id']}", params={"wait": 60}).json()
    assert job["status"] == "succeeded", job


def test_a_job_that_would_wait_past_max_queue_time_is_refused(
    queue_stack: Stack, api: httpx.Client, store: redis.Redis
) -> None:
    """Admission weighed only the job's own deadline: with none, or a far one, a job behind more
    than `max_queue_time_s` of work was accepted (202), to expire in the queue. One without a
    deadline is weighed once a refresh has seen work waiting (the workers' capacity, not a light
    load's arrivals)."""
    serve(queue_stack, "brief")
    _measured(api, "brief", admits=True)  # ~1 s of work: none expires
    _drained(store, BRIEF)
    # ~100 jobs of 100 ms ahead, far past the 3 s any of them may wait (none expires yet)
    asyncio.run(_enqueued_replying_to_nobody(queue_stack.redis_url, _job()["inputs"], "brief", 100))
    added = store.get(KEYS.added(BRIEF))
    _refused_past_max_queue_time(
        api.post("/v1/jobs", json=_job("brief", deadline=time.time() + 600))
    )
    assert store.get(KEYS.added(BRIEF)) == added  # nothing enqueued

    def refused() -> httpx.Response | None:
        response = api.post("/v1/jobs", json=_job("brief"))  # a 202 only adds to the backlog
        return response if response.status_code == 429 else None

    _refused_past_max_queue_time(until(refused, timeout=5, every=0.2))
    _drained(store, BRIEF)


def _refused_past_max_queue_time(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] == "deadline_unmeetable" and error["eta_ms"] > 3_000, error
    assert "max_queue_time_s" in error["message"], error
    assert int(response.headers["Retry-After"]) in range(1, 61)  # the limit moves with a retry


def test_a_rate_measured_before_a_pause_still_counts(api: httpx.Client, store: redis.Redis) -> None:
    """Once the window held no completion (a pause longer than RATE_WINDOW_S), a partition with
    a worker serving had no rate: the next burst's 202s said `eta_ms: null`, and deadline
    admission let every job in."""
    _drained(store)
    _measured(api, backlog=30)  # ~3 s of work: refreshes see it wait, measuring the capacity
    _drained(store)
    time.sleep(RATE_WINDOW_S + 2 * REFRESH_S)  # the pause itself: nothing drains meanwhile
    burst = _submit(api, 10)  # ~1 s of work: five times the 0.2 s deadline below
    waiting = [job for job in burst if job["queue_position"] > 0]
    assert waiting and all(job["eta_ms"] is not None for job in waiting), burst
    response = api.post("/v1/jobs", json=_job(ttl_s=0.2))
    assert response.status_code == 429, response.text
    assert response.json()["error"]["type"] == "deadline_unmeetable"
    _drained(store)


@pytest.mark.parametrize(
    "extra",
    [{"deadline": -5}, {"deadline": 0}, {"deadline": 1_000_000_000}, {"ttl_s": -1}],
    ids=["negative", "zero", "past", "negative-ttl"],
)
def test_a_bad_deadline_is_refused_and_nothing_enqueued(
    api: httpx.Client, store: redis.Redis, extra: dict[str, float]
) -> None:
    before = store.xlen(STEADY), store.get(KEYS.added(STEADY))
    response = api.post("/v1/jobs", json={**_job(), **extra})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["type"] == "invalid_request"
    assert "deadline" in response.json()["error"]["message"] or "ttl_s" in response.text
    assert store.get(KEYS.added(STEADY)) == before[1] and store.xlen(STEADY) <= before[0]


def _events_with_times(base_url: str, job_id: str, stop: str) -> list[tuple[float, dict[str, str]]]:
    """The job's events, each with when it arrived, up to the first `stop` event."""
    seen = []
    with httpx.stream("GET", f"{base_url}/v1/jobs/{job_id}/events", timeout=60) as response:
        assert response.status_code == 200
        for event in sse_events(response.iter_lines()):
            seen.append((time.monotonic(), event))
            if event["event"] == stop:
                return seen
    raise AssertionError(f"no {stop} event in {seen}")


def test_queued_events_at_most_once_a_second(
    queue_stack: Stack, api: httpx.Client, store: redis.Redis
) -> None:
    _drained(store)
    _measured(api)
    *_, last = _submit(api, 30)  # ~3 s more of jobs ahead
    events = _events_with_times(queue_stack.base_url, last["id"], "final")
    queued = [(at, httpx.Response(200, content=e["data"]).json()) for at, e in events[:-1]]
    assert all(e["event"] == "queued" for _, e in events[:-1]), events
    assert len(queued) >= 3, events
    positions = [data["queue_position"] for _, data in queued]
    assert positions == sorted(positions, reverse=True) and positions[0] > positions[-1]
    gaps = [later - earlier for (earlier, _), (later, _) in pairwise(queued)]
    # at most one a second, as the client hears them: a stall of the client's process may
    # bunch two up by a few hundred ms, not by half a second each time
    assert min(gaps) >= 0.5 and statistics.median(gaps) >= 0.9, gaps


def test_scaling_event_when_no_worker_serves_the_partition(
    queue_stack: Stack, api: httpx.Client
) -> None:
    response = api.post("/v1/jobs", json=_job("idle"))
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["queue_position"] == 0 and job["eta_ms"] is None

    events = _events_with_times(queue_stack.base_url, job["id"], "queued")
    names = [event["event"] for _, event in events]
    assert names == ["scaling", "queued"], events
    scaling = httpx.Response(200, content=events[0][1]["data"]).json()
    assert scaling["consumers"] == 0 and scaling["eta_ms"] is None and "KEDA" in scaling["message"]
    assert api.delete(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"


def _event_names(base_url: str, job_id: str, seen: list[str]) -> None:
    """Append the name of each of the job's events to `seen` as it arrives, up to `final`."""
    with httpx.stream("GET", f"{base_url}/v1/jobs/{job_id}/events", timeout=120) as response:
        for event in sse_events(response.iter_lines()):
            seen.append(event["event"])
            if event["event"] == "final":
                return


def test_scaling_event_when_the_worker_dies_with_the_job_at_the_head(
    queue_stack: Stack, api: httpx.Client, store: redis.Redis
) -> None:
    """A job at the head of its lane with a worker serving got no more events, so once that
    worker died its stream never said `scaling`, though no worker served the partition."""
    _drained(store)
    running = api.post("/v1/jobs", json=_job(inputs={"sleep_ms": 120_000})).json()
    until(lambda: api.get(running["urls"]["self"]).json()["status"] == "running")
    head = api.post("/v1/jobs", json=_job()).json()
    assert head["queue_position"] == 0, head
    seen: list[str] = []
    reader = threading.Thread(target=_event_names, args=(queue_stack.base_url, head["id"], seen))
    reader.start()
    try:
        # the stream has seen it at the head, a worker serving (whose heartbeat outlives it
        # by up to HEARTBEAT_TTL_S: a look late by some ticks sees it serving all the same)
        time.sleep(QUEUED_EVERY_S)
        queue_stack.stop_process("steady", sig=signal.SIGKILL)
        # cancelled, its rerun (after the visibility timeout) does not hold the next worker
        assert api.delete(running["urls"]["self"]).json()["status"] == "cancelled"
        # the hang guard as long as ever (the default TTL's): it only bounds a failure
        until(lambda: "scaling" in seen, timeout=TTL_S + 30, every=0.5)
    finally:
        queue_stack.start_worker("steady")
        reader.join(timeout=60)
    assert seen[-1] == "final" and seen.index("scaling") < seen.index("final"), seen
    _drained(store)  # the killed worker's cancelled job, reclaimed by the new one


def test_cli_jobs_wait_shows_progress(
    queue_stack: Stack, api: httpx.Client, store: redis.Redis
) -> None:
    _drained(store)
    _measured(api)
    *_, job = _submit(api, 45)  # ~5 s of jobs ahead (the CLI takes a while to start)
    result = subprocess.run(
        [CONVEYOR, "jobs", "wait", job["id"], "--url", queue_stack.base_url],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "succeeded"
    lines = result.stderr.splitlines()
    assert len(lines) >= 2 and all(line.startswith("queued: ") for line in lines), lines
    assert " ahead, starts in ~" in lines[0], lines


async def _refresh(
    eta: QueueEta, monkeypatch: pytest.MonkeyPatch, loads: list[PartitionLoad]
) -> None:
    """Refresh `eta` once per load of `steady` (as `read_partition_loads` would read it), the
    lanes' backlog as Redis holds it."""
    for load in loads:

        async def read(*_: object, load: PartitionLoad = load) -> dict[Partition, PartitionLoad]:
            return {("steady", "default"): load}

        monkeypatch.setattr(queue_eta, "read_partition_loads", read)
        await eta.refresh()


def _queue_eta(aredis: aioredis.Redis) -> QueueEta:
    return QueueEta(aredis, QueuePositions(aredis, KEYS), ModelRepository.load(FIXTURES))


async def test_capacity_outlives_the_lane_running_dry(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept rate was the last non-zero window's: once a burst drained, the 5 s window
    stepped down to a tail of the burst's last second, so the next burst's ETAs were several
    times too long and deadline admission refused jobs that would start in time."""
    eta = _queue_eta(aredis)
    config = eta.repository.models["steady"]
    await aredis.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    for index in range(20):  # work waits throughout: the window's rate is the capacity
        await aredis.xadd(STEADY, {"n": index})
    await _refresh(eta, monkeypatch, [PartitionLoad(9.0, serving=1)] * RATE_WINDOW_S)
    await aredis.delete(STEADY)  # drained: the window steps down with nothing left to do
    for rate in (7.2, 5.4, 3.6, 1.8, 0.8, 0.0, 0.0):
        await _refresh(eta, monkeypatch, [PartitionLoad(rate, serving=1)])
        assert eta.lane_rate(config, "default", bulk=False) >= 4.5, rate
    # no deadline, the capacity known: held to max_queue_time_s
    assert eta.max_ahead(config, "default", False, StartBy.of(config, stamp_ms(), 0)) > 0


async def test_a_light_load_limits_no_job(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lane never backlogged drains what arrives: its rate (1/s) is not the worker's, yet
    `max_queue_time_s` was applied with it to every job without a deadline, and a job's own
    deadline was weighed by it: after a minute at 1 job/s, 14 of a burst of 20 jobs with
    `ttl_s: 4` were refused (429, "would start in about 4679 ms"), where `steady`'s worker
    started each within 2 s. Once a refresh times the workers on work waiting, the capacity
    limits them."""
    eta = _queue_eta(aredis)
    config = eta.repository.models["steady"]
    await _refresh(eta, monkeypatch, [PartitionLoad(1.0, serving=1)] * 7)
    no_deadline = StartBy.of(config, stamp_ms(), 0)
    assert eta.max_ahead(config, "default", False, no_deadline) == -1
    deadline = StartBy.of(config, stamp_ms(), int(stamp_ms()) + 4_000)
    assert eta.max_ahead(config, "default", False, deadline) == -1
    await aredis.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    for index in range(20):  # the burst, waiting: the workers' capacity is measured
        await aredis.xadd(STEADY, {"n": index})
    await _refresh(eta, monkeypatch, [PartitionLoad(9.0, serving=1)])
    assert eta.max_ahead(config, "default", False, deadline) == -1  # too soon to time them
    await asyncio.sleep(MIN_SPELL_S)
    await _refresh(eta, monkeypatch, [PartitionLoad(9.0, serving=1)])
    assert 30 <= eta.max_ahead(config, "default", False, deadline) <= 40


async def test_a_bulk_head_with_no_share_has_no_eta_while_online_work_waits(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `bulk_share: 0` the bulk lane is read only once online is idle: its head showed
    `eta_ms: 0` (an idle worker takes it at once) while online jobs waited ahead of it."""
    eta = _queue_eta(aredis)
    no_share = eta.repository.models["steady"].model_copy(update={"bulk_share": 0.0})
    await aredis.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    await _refresh(eta, monkeypatch, [PartitionLoad(0.0, serving=1)])
    assert eta.standing(no_share, "default", bulk=True, position=0).eta_ms == 0
    await aredis.xadd(STEADY, {"n": 1})  # online work waits: the bulk head waits behind it
    await _refresh(eta, monkeypatch, [PartitionLoad(0.0, serving=1)])
    assert eta.standing(no_share, "default", bulk=True, position=0).eta_ms is None
    assert eta.standing(no_share, "default", bulk=False, position=0).eta_ms == 0

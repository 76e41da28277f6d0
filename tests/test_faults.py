"""Nothing lost under faults, proven by injecting them for real: kill -9 of a worker mid-batch,
poison items, a worker that dies on an entry until it is dead-lettered, a Redis restart under
load, deadlines, idempotency, backpressure and SIGTERM drains."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import redis
import redis.asyncio as aioredis

from conveyor.stack import Stack, free_port
from producer_api.jobs.admission import Backpressure
from shared.keys import Keys
from tests.conftest import REPO_ROOT, ended, running_stack, until
from tests.fault_engine import FIXED_ENV
from tests.webhook_receiver import Receiver, serving
from workers.runtime.broker_outage_log import CONNECTION_LOGGER, CONSUMER_LOGGER
from workers.runtime.memory_ceiling import RECYCLED

KEYS = Keys("cv:")

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"
STREAM = KEYS.queue("faulty", "default")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with serving() as server:
        yield server


@pytest.fixture(scope="module")
def fault_stack(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Stack]:
    """Its own Valkey with AOF fsync on every write, and a producer over the test models."""
    with running_stack(
        tmp_path_factory.mktemp("faults"),
        valkey_config={"appendonly": "yes", "appendfsync": "always"},
        CONVEYOR_MODEL_REPOSITORY=str(FIXTURES),
        PYTHONPATH=str(REPO_ROOT),  # the custom backend lives in tests/
        CONVEYOR_AUTH="disabled",  # faults, not keys, are under test here
        CONVEYOR_WEBHOOK_ALLOWLIST=f"{receiver.base}/",
        CONVEYOR_WEBHOOK_SECRET="whsec-faults",
    ) as stack:
        yield stack


# The faulty worker that tests in a row share (`shared_worker`): a start is seconds of one
# process importing. Only tests that ask for it ever see it running.
SHARED = "shared"


@pytest.fixture(autouse=True)
def _shared_worker_only_where_asked(request: pytest.FixtureRequest) -> None:
    """Stops the shared worker before a test on the module's stack that does not ask for it:
    that test's workers, and only they, read the lanes. A test off the stack has its own Valkey,
    which the shared worker never reads."""
    if "fault_stack" in request.fixturenames and "shared_worker" not in request.fixturenames:
        stack: Stack = request.getfixturevalue("fault_stack")
        if SHARED in stack.processes:
            stack.stop_process(SHARED)


@pytest.fixture
def shared_worker(fault_stack: Stack) -> int:
    """The pid of a faulty worker started by the first of the tests in a row that ask for it,
    and kept for the next (one that exited meanwhile is replaced: each test asserts its own
    worker lives on); stopped before the first test after them that does not ask for it."""
    if SHARED in fault_stack.processes and fault_stack.processes[SHARED].poll() is not None:
        fault_stack.stop_process(SHARED)
    if SHARED not in fault_stack.processes:
        fault_stack.start_worker("faulty", name=SHARED)
    return fault_stack.processes[SHARED].pid


@pytest.fixture
def r(fault_stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(fault_stack.redis_url, decode_responses=True)
    yield client
    client.close()


def _job(r: redis.Redis, job_id: str) -> dict[str, str]:
    fields: dict[str, str] = r.hgetall(KEYS.job(job_id))  # type: ignore[assignment]
    return fields


def _jobs(r: redis.Redis, ids: list[str]) -> list[dict[str, str]]:
    """Several jobs' fields in one round trip: a poll of hundreds one by one kept a core busy."""
    with r.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hgetall(KEYS.job(job_id))
        jobs: list[dict[str, str]] = pipe.execute()
    return jobs


def _wait_terminal(r: redis.Redis, ids: list[str], timeout: float = 120) -> list[dict[str, str]]:
    def ended() -> list[dict[str, str]] | None:
        jobs = _jobs(r, ids)
        terminal = {"succeeded", "failed", "cancelled", "expired"}
        return jobs if all(j.get("status") in terminal for j in jobs) else None

    jobs: list[dict[str, str]] = until(ended, timeout)
    return jobs


async def _submit_many(base_url: str, bodies: list[dict[str, Any]], rate: float) -> list[str]:
    """Open-loop submits at `rate` per second; returns ids of the accepted (202) jobs."""
    timeout = httpx.Timeout(60, pool=None)  # a loaded 2-core machine queues requests a while
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as client:

        async def one(delay: float, body: dict[str, Any]) -> str:
            await asyncio.sleep(delay)
            response = await client.post("/v1/jobs", json=body)
            assert response.status_code == 202, response.text
            job_id: str = response.json()["id"]
            return job_id

        return list(await asyncio.gather(*(one(i / rate, b) for i, b in enumerate(bodies))))


def _connections_of(r: redis.Redis, name: str) -> list[dict[str, Any]]:
    return [c for c in r.client_list() if c.get("name") == name]


def _faulty(inputs: dict[str, Any]) -> dict[str, Any]:
    return {"model": "faulty", "inputs": inputs}


def _attempts(stack: Stack, ids: list[str]) -> list[list[dict[str, Any]]]:
    """Each job's attempt history, as `GET /v1/jobs/{id}?attempts=true` shows it."""
    with httpx.Client(base_url=stack.base_url) as client:  # one connection for them all
        answers = [client.get(f"/v1/jobs/{i}", params={"attempts": "true"}) for i in ids]
    return [answer.json()["attempt_history"] for answer in answers]


def _start_workers(stack: Stack, *names: str) -> list[int]:
    """Faulty workers started side by side (a start is mostly one process importing, which
    leaves the other core idle); their pids once every one reads."""
    return stack.wait_ready(*[stack.spawn_worker("faulty", name=name) for name in names])


def test_kill_9_mid_batch_loses_nothing_and_writes_once(fault_stack: Stack, r: redis.Redis) -> None:
    victim, survivor = _start_workers(fault_stack, "victim", "survivor")
    bodies = [_faulty({"n": i, "sleep_ms": 100}) for i in range(300)]
    orphans: list[str] = []  # job ids of the entries the dead victim still owned

    def kill_mid_batch() -> None:
        consumer = fault_stack.consumer_name(victim)

        def mid_batch() -> bool:
            return len(r.xpending_range(STREAM, "workers", "-", "+", 1000, consumer)) >= 2

        until(mid_batch, timeout=20, every=0.005)  # a micro-batch is in hand for ~0.1 s
        os.kill(victim, signal.SIGKILL)
        fault_stack.processes["victim"].wait()
        # Commands it sent before dying still run until the server sees its
        # connections close; only then is what it owns final.
        until(lambda: not _connections_of(r, consumer), timeout=10)
        # what the dead consumer still owns once it is gone: these must be reclaimed
        for row in r.xpending_range(STREAM, "workers", "-", "+", 1000, consumer):
            entry: list[tuple[str, dict[str, str]]] = r.xrange(  # type: ignore[assignment]
                STREAM, row["message_id"], row["message_id"]
            )
            orphans.extend(fields["id"] for _, fields in entry)  # none: reclaimed already

    killer = threading.Thread(target=kill_mid_batch)
    killer.start()
    try:
        ids = asyncio.run(_submit_many(fault_stack.base_url, bodies, rate=300))
        killer.join()
        assert orphans, "the victim was never caught mid-batch"
        jobs = _wait_terminal(r, ids)
    finally:
        fault_stack.stop_processes(["survivor", "victim"])
    assert [j["status"] for j in jobs] == ["succeeded"] * len(ids)
    assert [j["writes"] for j in jobs] == ["1"] * len(ids)
    # Each was reclaimed and finished by the survivor. (Its attempts may still be 1: an
    # entry delivered by a blocking read is claimed in the next call, which the kill can cut.)
    served_by = {job_id: _job(r, job_id)["worker"] for job_id in orphans}
    assert set(served_by.values()) == {fault_stack.consumer_name(survivor)}, served_by
    assert r.xlen(STREAM) == 0
    # and each one's history names both workers: the victim's attempt crashed, the survivor's
    # succeeded
    both = [
        (fault_stack.consumer_name(victim), "crashed"),
        (fault_stack.consumer_name(survivor), "succeeded"),
    ]
    for history in _attempts(fault_stack, orphans):
        assert [(run["consumer"], run["outcome"]) for run in history] == both, history
        assert history[0]["error"]["type"] == "WorkerLost"


def test_poison_item_fails_alone(fault_stack: Stack, r: redis.Redis) -> None:
    bodies = [_faulty({"n": i, "sleep_ms": 0}) for i in range(32)]
    bodies[13] = _faulty({"n": 13, "action": "raise", "tag": "bad-13"})
    ids = asyncio.run(_submit_many(fault_stack.base_url, bodies, rate=10_000))
    fault_stack.start_worker("faulty", name="poison")
    try:
        jobs = _wait_terminal(r, ids)
        statuses = [j["status"] for j in jobs]
        assert statuses.count("succeeded") == 31 and statuses[13] == "failed"
        assert '"type":"ValueError"' in jobs[13]["error"] and "bad-13" in jobs[13]["error"]
        assert max(int(j["batch_size"]) for j in jobs) > 1
        after = httpx.post(
            f"{fault_stack.base_url}/v1/jobs",
            json=_faulty({"ok": 1}),
            params={"wait": 30},
            timeout=60,  # past the wait: httpx's default 5 s cut a long-poll on a loaded machine
        )
        assert after.json()["status"] == "succeeded"
    finally:
        fault_stack.stop_process("poison")


def test_crashing_entry_is_dead_lettered_then_replayed(
    fault_stack: Stack, r: redis.Redis, receiver: Receiver
) -> None:
    hook = f"{receiver.base}/dead"
    accepted = httpx.post(
        f"{fault_stack.base_url}/v1/jobs",
        json={**_faulty({"action": "crash", "tag": "killer"}), "webhook": hook},
    )
    job_id = accepted.json()["id"]
    pids = []
    for attempt in range(3):  # max_deliveries is 2: deliveries 1 and 2 crash, the 3rd is dead
        name = f"crash-{attempt}"
        process_pid = fault_stack.start_worker("faulty", name=name)
        pids.append(process_pid)
        worker = fault_stack.processes[name]
        until(lambda: _job(r, job_id)["status"] == "failed" or worker.poll() is not None)  # noqa: B023
        exit_code = fault_stack.stop_process(name)
        assert (exit_code == 3) == (attempt < 2), (attempt, exit_code, process_pid)
    job = _job(r, job_id)
    assert job["status"] == "failed" and "DeadLettered" in job["error"]
    assert "dead-lettered after 2 deliveries without finishing (max_deliveries 2)" in job["error"]
    [runs] = _attempts(fault_stack, [job_id])
    history = [(run["consumer"], run["outcome"]) for run in runs]
    assert history == [
        (fault_stack.consumer_name(pids[0]), "crashed"),
        (fault_stack.consumer_name(pids[1]), "dead-lettered"),
    ]
    models = httpx.get(f"{fault_stack.base_url}/v1/models").json()["data"]
    faulty = next(m for m in models if m["id"] == "faulty")
    assert faulty["partitions"][0]["dlq_depth"] == 1

    # it starts while the CLI lists the letter (nothing it reads waits until the replay)
    fixed = fault_stack.spawn_worker("faulty", name="fixed", **{FIXED_ENV: "1"})
    conveyor = Path(sys.executable).parent / "conveyor"
    # the workers' repository: a replay is refused for a model no worker could serve
    env = {
        **os.environ,
        "CONVEYOR_REDIS_URL": fault_stack.redis_url,
        "CONVEYOR_MODEL_REPOSITORY": str(FIXTURES),
    }
    try:
        listed = subprocess.run(
            [conveyor, "dlq", "list", "faulty"], env=env, capture_output=True, text=True, check=True
        )
        assert job_id in listed.stdout and "max_deliveries 2" in listed.stdout
        ((_, letter),) = r.xrange(KEYS.dlq("faulty", "default"))
        assert letter["lane"] == KEYS.queue("faulty", "default")  # where its replay goes
        fault_stack.wait_ready(fixed)
        until(lambda: receiver.at("/dead"))  # queued by the worker that dead-lettered it
        (delivery,) = receiver.at("/dead")
        notified = json.loads(delivery["body"])
        assert notified["type"] == "job.failed" and notified["data"]["id"] == job_id
        assert notified["data"]["error"]["type"] == "DeadLettered"
        replayed = subprocess.run(
            [conveyor, "dlq", "replay", "faulty"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        pair, counts = replayed.stdout.splitlines()
        old, _, new = pair.partition(" -> ")
        assert old == job_id and counts == "replayed 1, kept 0"
        assert _wait_terminal(r, [new])[0]["status"] == "succeeded"
        assert _job(r, new)["replay_of"] == job_id
    finally:
        fault_stack.stop_process("fixed")
    assert r.xlen(KEYS.dlq("faulty", "default")) == 0


def test_a_worker_whose_consumer_dies_exits_to_be_restarted(
    fault_stack: Stack, r: redis.Redis
) -> None:
    """An engine that calls sys.exit() (no Exception: nothing on the way catches it) ended the
    consumer thread while the process lived on, reading nothing and never restarted. The
    worker now exits with EX_SOFTWARE, so `conveyor up` or Kubernetes starts another. The job
    is given a short deadline: after the crash it is expired, not run by a later test's worker."""
    pid = fault_stack.start_worker("faulty", name="exiter")
    body = {**_faulty({"action": "exit"}), "ttl_s": 1.0}
    assert httpx.post(f"{fault_stack.base_url}/v1/jobs", json=body).status_code == 202
    try:
        code = psutil.Process(pid).wait(timeout=60)
    finally:
        fault_stack.stop_process("exiter")
    assert code == os.EX_SOFTWARE
    log = "\n".join(fault_stack.log_tail("exiter", 200))
    assert "the consumer stopped on an unexpected error; the worker exits" in log


def test_a_worker_past_its_memory_ceiling_drains_and_exits_to_be_restarted(
    fault_stack: Stack, r: redis.Redis
) -> None:
    """A worker whose engine leaks (a library's cache) grew until the OOM killer's SIGKILL cut
    its batch off. With CONVEYOR_WORKER_MAX_MEMORY_MB it is recycled as Celery's
    worker_max_memory_per_child does: passed mid-batch (the job leaks, then takes a while), the
    ceiling lets the batch finish and be written back, then the worker stops reading and exits
    75, for `conveyor up` or Kubernetes to start another, its log saying why."""
    pid = fault_stack.start_worker("faulty", name="leaky", CONVEYOR_WORKER_MAX_MEMORY_MB="300")
    body = _faulty({"hold_mb": 400, "sleep_ms": 1500})  # an idle worker holds ~100 MiB
    answer = httpx.post(f"{fault_stack.base_url}/v1/jobs", json=body)
    assert answer.status_code == 202
    try:
        code = psutil.Process(pid).wait(timeout=60)
    finally:
        fault_stack.stop_process("leaky")
    assert code == RECYCLED
    [job] = _jobs(r, [answer.json()["id"]])
    assert (job["status"], job["writes"]) == ("succeeded", "1")
    assert not r.xpending_range(STREAM, "workers", "-", "+", 10, fault_stack.consumer_name(pid))
    log = "\n".join(fault_stack.log_tail("leaky", 200))
    assert "passed CONVEYOR_WORKER_MAX_MEMORY_MB=300" in log


def test_redis_restart_under_load_answers_503_and_loses_nothing(
    fault_stack: Stack, r: redis.Redis, shared_worker: int
) -> None:
    accepted: list[str] = []
    statuses: list[int] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=fault_stack.base_url, timeout=30) as client:
            n = 0
            while not stop.is_set():
                response = client.post("/v1/jobs", json=_faulty({"n": n, "sleep_ms": 5}))
                statuses.append(response.status_code)
                if response.status_code == 202:
                    accepted.append(response.json()["id"])
                else:
                    assert response.headers.get("Retry-After"), response.text
                n += 1
                time.sleep(0.01)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        until(lambda: len(accepted) >= 50)  # under load
        fault_stack.restart_valkey(down_s=2.0)
        served_before = len(accepted)
        until(lambda: len(accepted) >= served_before + 50)  # and under load again after
    finally:
        stop.set()
        loader.join()
    assert 503 in statuses and 500 not in statuses
    assert set(statuses) <= {202, 503}
    assert statuses[-1] == 202
    jobs = _wait_terminal(r, accepted)
    assert [j["status"] for j in jobs] == ["succeeded"] * len(accepted)
    ready = httpx.get(f"{fault_stack.base_url}/readyz")
    assert ready.status_code == 200


def test_an_output_json_cannot_hold_fails_alone(
    fault_stack: Stack, r: redis.Redis, shared_worker: int
) -> None:
    bodies = [_faulty({"n": i, "output": "bytes" if i == 3 else None}) for i in range(8)]
    ids = asyncio.run(_submit_many(fault_stack.base_url, bodies, rate=1000))
    jobs = _wait_terminal(r, ids, timeout=60)
    assert [job["status"] for job in jobs] == ["succeeded"] * 3 + ["failed"] + ["succeeded"] * 4
    assert json.loads(jobs[3]["error"])["type"] == "InvalidOutput"


@contextmanager
def _out_of_memory(r: redis.Redis) -> Iterator[None]:
    r.config_set("maxmemory", 1)  # below what it holds: every write is refused
    try:
        yield
    finally:
        r.config_set("maxmemory", 0)


@contextmanager
def _unable_to_persist(r: redis.Redis) -> Iterator[None]:
    """A snapshot that fails (its file's place taken by a directory here; a full disk in life)
    while save points are set: Valkey refuses writes with MISCONF until one succeeds, or none
    is set."""
    saves = r.config_get("save")["save"]
    blocker = Path(r.config_get("dir")["dir"]) / r.config_get("dbfilename")["dbfilename"]
    r.config_set("save", "3600 1")
    blocker.mkdir()  # the AOF persists this server: no snapshot of it exists to be in the way
    try:
        r.bgsave()
        until(lambda: r.info("persistence")["rdb_last_bgsave_status"] == "err", 30)
        yield
    finally:
        blocker.rmdir()
        r.config_set("save", saves)


@contextmanager
def _too_few_replicas(r: redis.Redis) -> Iterator[None]:
    """min-replicas-to-write on a server with none: NOREPLICAS, which ended a worker's consumer
    (and its restart: creating a group is a write) as redis-py maps no error class to it."""
    r.config_set("min-replicas-to-write", 1)
    try:
        yield
    finally:
        r.config_set("min-replicas-to-write", 0)


@pytest.mark.parametrize(
    ("refusing", "message"),
    [
        (_out_of_memory, "the queue's Redis is out of memory (its maxmemory); retry later"),
        (_unable_to_persist, "the queue's Redis cannot write to its disk (MISCONF); retry later"),
        (
            _too_few_replicas,
            "the queue's Redis has too few replicas to take writes (NOREPLICAS); retry later",
        ),
    ],
)
def test_a_redis_refusing_writes_is_a_503_and_a_worker_holds_its_results(
    fault_stack: Stack,
    r: redis.Redis,
    refusing: Callable[[redis.Redis], AbstractContextManager[None]],
    message: str,
    shared_worker: int,
) -> None:
    """At its maxmemory (noeviction), unable to persist, or short of replicas, Redis refuses
    writes: a submit was a 500, and the worker's write-back stopped its consumer. Now the submit
    is a 503 to retry, and the worker keeps the result in hand until Redis takes it."""
    pid = shared_worker
    running = _faulty({"n": 1, "sleep_ms": 1500})
    job_id = httpx.post(f"{fault_stack.base_url}/v1/jobs", json=running).json()["id"]
    until(lambda: _job(r, job_id).get("status") == "running", 30)  # marked after 0.1 s
    with refusing(r):
        refused = httpx.post(f"{fault_stack.base_url}/v1/jobs", json=_faulty({"n": 2}))
        time.sleep(2)  # the run ends; its write-back is refused and retried
        assert _job(r, job_id)["status"] == "running"
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "5"
    assert refused.json()["error"] == {"type": "unavailable", "message": message}
    assert _wait_terminal(r, [job_id], timeout=30)[0]["status"] == "succeeded"
    assert psutil.Process(pid).is_running()  # the same worker wrote it


def test_a_micro_batch_longer_than_the_visibility_timeout_runs_once(
    fault_stack: Stack, r: redis.Redis, shared_worker: int
) -> None:
    """A batch loop never re-claimed its entries (only a generate loop did): a micro-batch that
    ran past `visibility_timeout_s` (faulty's: 2 s) was reclaimed by the other worker and run
    again, and its record gained a false `crashed` attempt."""
    names = ["patient"]  # and the shared worker: two
    pids = [shared_worker, *_start_workers(fault_stack, *names)]
    try:
        body = _faulty({"n": 1, "sleep_ms": 5000})
        job_id = httpx.post(f"{fault_stack.base_url}/v1/jobs", json=body).json()["id"]
        [job] = _wait_terminal(r, [job_id], timeout=60)
        assert all(psutil.Process(pid).is_running() for pid in pids)
    finally:
        fault_stack.stop_processes(names)
    assert job["status"] == "succeeded" and job["writes"] == "1", job
    history = json.loads(job["attempt_history"])
    assert [attempt["outcome"] for attempt in history] == ["succeeded"], history


def test_a_dead_device_hands_its_micro_batch_back_and_its_worker_exits(
    fault_stack: Stack, r: redis.Redis, tmp_path: Path
) -> None:
    """A CUDA error that poisons the device fails every engine call after it: the worker
    bisected each micro-batch, failed every job of it and of every one after (the queue drained
    into failures, fast), while it looked alive. Now its jobs stay pending and it exits; a new
    worker runs them all."""
    poisoned = tmp_path / "poisoned"
    poisoned.touch()
    worker = psutil.Process(fault_stack.start_worker("faulty", name="poisoned"))
    url = f"{fault_stack.base_url}/v1/jobs"
    first = httpx.post(url, json=_faulty({"n": 1, "while": str(poisoned)}), timeout=30)
    assert first.status_code == 202, first.text  # first in the lane: in the first read
    bodies = [_faulty({"n": n}) for n in range(8)]
    ids = [first.json()["id"], *asyncio.run(_submit_many(fault_stack.base_url, bodies, 1000))]
    worker.wait(timeout=60)  # raises if the worker lives on
    assert {_job(r, i)["status"] for i in ids} <= {"queued", "running"}
    poisoned.unlink()  # the device mended (a new pod, another GPU)
    fault_stack.start_worker("faulty", name="mended")
    try:
        jobs = _wait_terminal(r, ids, timeout=60)
    finally:
        fault_stack.stop_process("mended")
    assert [job["status"] for job in jobs] == ["succeeded"] * len(ids), jobs


def test_a_redis_that_turned_replica_is_a_503_until_it_is_master_again(
    fault_stack: Stack, r: redis.Redis, receiver: Receiver
) -> None:
    """A failover behind one address (a managed Redis's endpoint) leaves clients on the old
    master, now a replica that refuses writes with READONLY: a submit was a 500. Here the one
    Valkey turns replica of a master that is not there, then master again. A worker rides it
    out: it used to exit, as Celery's own broker connection took the replica's UNBLOCKED (its
    BRPOP cut by the role change), then READONLY, as unrecoverable."""
    pid = fault_stack.start_worker("faulty", name="demoted")
    url = f"{fault_stack.base_url}/v1/jobs"
    r.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
    try:
        refused = httpx.post(url, json=_faulty({"n": 1}), timeout=30)
        time.sleep(1.5)  # the worker's reads, Celery's included, meet the replica
    finally:
        r.execute_command("REPLICAOF", "NO", "ONE")
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"] == {
        "type": "unavailable",
        "message": "the queue's Redis is a replica for now (a failover?); retry shortly",
    }
    try:  # its webhook is handed to Celery's broker, and delivered by the one worker's Celery
        body = {**_faulty({"n": 2}), "webhook": f"{receiver.base}/after-replica"}
        accepted = httpx.post(url, json=body, timeout=30)
        assert accepted.status_code == 202, accepted.text
        job = _wait_terminal(r, [accepted.json()["id"]], timeout=30)[0]
        assert job["status"] == "succeeded", job
        until(lambda: receiver.at("/after-replica"), 30)
        assert psutil.Process(pid).is_running(), fault_stack.log_tail("demoted")
        # Celery's restarts against the replica (some thirty lines) are two: the first, and
        # one that says when the broker was back
        celery = _celery_connection_lines(fault_stack.log_path("demoted"))
        assert [line["name"] for line in celery] == [CONSUMER_LOGGER, CONNECTION_LOGGER], celery
        assert " again after " in celery[1]["message"], celery
    finally:
        fault_stack.stop_process("demoted")


def _celery_connection_lines(log: Path) -> list[dict[str, Any]]:
    """A worker log's records of Celery's broker connection at WARNING or above."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [
        record
        for record in records
        if record["name"] in (CONSUMER_LOGGER, CONNECTION_LOGGER)
        and record["level"] in ("WARNING", "ERROR", "CRITICAL")
    ]


def test_deadline_expires_without_running(fault_stack: Stack, r: redis.Redis) -> None:
    body = {**_faulty({"late": True}), "ttl_s": 0.2}
    job_id = httpx.post(f"{fault_stack.base_url}/v1/jobs", json=body).json()["id"]
    time.sleep(0.5)
    fault_stack.start_worker("faulty", name="late")
    try:
        job = ended(f"{fault_stack.base_url}/v1/jobs/{job_id}")
    finally:
        fault_stack.stop_process("late")
    assert job["status"] == "expired" and job["error"]["type"] == "DeadlineExceeded"
    assert "outputs" not in job and "engine_ms" not in _job(r, job_id)


def test_idempotency_key(fault_stack: Stack) -> None:
    url = f"{fault_stack.base_url}/v1/jobs"
    headers = {"Idempotency-Key": "order-42"}
    first = httpx.post(url, json=_faulty({"a": 1}), headers=headers)
    again = httpx.post(url, json=_faulty({"a": 1}), headers=headers)
    other = httpx.post(url, json=_faulty({"a": 2}), headers=headers)
    assert first.status_code == 202
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert other.status_code == 409 and other.json()["error"]["type"] == "conflict"
    fresh = httpx.post(url, json=_faulty({"a": 1}), headers={"Idempotency-Key": "order-43"})
    assert fresh.status_code == 202 and fresh.json()["id"] != first.json()["id"]


def test_queue_limit_answers_429_with_retry_after(fault_stack: Stack, r: redis.Redis) -> None:
    url = f"{fault_stack.base_url}/v1/jobs"
    codes = [httpx.post(url, json={"model": "tiny", "inputs": {"i": i}}) for i in range(8)]
    assert [c.status_code for c in codes] == [202] * 5 + [429] * 3
    assert int(codes[-1].headers["Retry-After"]) >= 1
    assert codes[-1].json()["error"]["type"] == "queue_full"
    assert r.xlen(KEYS.queue("tiny", "default")) == 5


def test_a_batch_its_bulk_lane_cannot_hold_is_accepted_and_held(
    fault_stack: Stack, r: redis.Redis
) -> None:
    """A batch is accepted whatever its bulk lane holds, as OpenAI's is: what the lane has no
    room for is held with the batch, and the lane never holds more than its limit (a batch
    larger than the limit was a 413, "split it", and one larger than the room now a 429)."""

    def batch(count: int) -> httpx.Response:
        lines = "".join(
            json.dumps({"custom_id": f"c{i}", "body": {"inputs": {"n": i}}}) + "\n"
            for i in range(count)
        )
        files = {"file": ("items.jsonl", lines.encode(), "application/jsonl")}
        url = f"{fault_stack.base_url}/v1/batches"
        return httpx.post(url, data={"model": "tiny"}, files=files, timeout=60)

    lane = KEYS.bulk_queue("tiny", "default")
    for count in (6, 3):
        accepted = batch(count)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["counts"]["pending"] == count
        assert r.xlen(lane) == 5


async def test_retry_after_counts_this_seconds_drain(aredis: aioredis.Redis) -> None:
    """Entries drained this very second are a drain rate, not an idle partition's minute."""
    backpressure = Backpressure(aredis, KEYS)
    idle = await backpressure.queue_full(STREAM, 5)
    await aredis.set(KEYS.drained(STREAM, int(time.time())), 20)
    draining = await backpressure.queue_full(STREAM, 5)
    assert idle.headers == {"Retry-After": "60"}
    assert draining.headers == {"Retry-After": "1"}, draining.message


def test_sigterm_drains_the_batch_in_hand(fault_stack: Stack, r: redis.Redis) -> None:
    # five micro-batches: the one in hand when the stop comes, and more that stay queued
    bodies = [_faulty({"n": i, "sleep_ms": 500}) for i in range(160)]
    # The worker starts while the jobs go in, and is stopped once it holds a micro-batch (its
    # first read may find one job come in): what it runs before the stop does not grow with
    # how long the submits take.
    drain = fault_stack.spawn_worker("faulty", name="drain")
    with ThreadPoolExecutor(1) as submitter:
        submitted = submitter.submit(
            asyncio.run, _submit_many(fault_stack.base_url, bodies, rate=10_000)
        )
        consumer = fault_stack.consumer_name(fault_stack.wait_ready(drain)[0])
        until(lambda: len(r.xpending_range(STREAM, "workers", "-", "+", 10, consumer)) >= 2)
        started = time.monotonic()
        assert fault_stack.stop_process("drain", signal.SIGTERM) == 0
        assert time.monotonic() - started < 30
        ids = submitted.result()
    assert r.xpending_range(STREAM, "workers", "-", "+", 100, consumer) == []
    statuses = [job["status"] for job in _jobs(r, ids)]
    assert "running" not in statuses and "succeeded" in statuses and "queued" in statuses
    finishers = ["finisher-1", "finisher-2"]  # two: the rest is ~2 s of work for one
    _start_workers(fault_stack, *finishers)
    try:
        assert {j["status"] for j in _wait_terminal(r, ids)} == {"succeeded"}
    finally:
        fault_stack.stop_processes(finishers)


def test_producer_sigterm_finishes_in_flight_requests(fault_stack: Stack, r: redis.Redis) -> None:
    slow = fault_stack.spawn_worker("faulty", name="slow")  # starts beside the producer
    base_url = fault_stack.start_producer(free_port(), name="producer-2")
    consumer = fault_stack.consumer_name(fault_stack.wait_ready(slow)[0])
    result: dict[str, Any] = {}

    def predict() -> None:
        response = httpx.post(
            f"{base_url}/v1/models/faulty/predict",
            json={"inputs": {"sleep_ms": 1500}},
            timeout=30,
        )
        result["response"] = response

    caller = threading.Thread(target=predict)
    caller.start()
    # the request is in flight once the worker holds its job
    until(lambda: r.xpending_range(STREAM, "workers", "-", "+", 10, consumer))
    try:
        # uvicorn re-raises the signal after its graceful shutdown, hence -SIGTERM
        assert fault_stack.stop_process("producer-2", signal.SIGTERM) in (0, -signal.SIGTERM)
        caller.join()
    finally:
        fault_stack.stop_process("slow")
    assert result["response"].status_code == 200
    assert result["response"].json()["status"] == "succeeded"

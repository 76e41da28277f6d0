"""Every attempt at a job on record (issue #17, part 5): the Lua scripts that end an attempt
(FINISH, TRANSITION, RECLAIM) append it to the job's `attempt_history` without a round trip of
their own; `GET /v1/jobs/{id}?attempts=true` and the SDK return it. The script-level tests run
on a bare Valkey with made-up consumers; one stack test drives a real worker through success,
engine failure, cancellation and expiry. Crashes under kill -9 and dead-lettering with real
workers are asserted in tests/test_faults.py. The write-back's other record, the lane's list of
ended jobs the console reads, is checked here too."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from conveyor.client import AsyncClient, Client
from conveyor.stack import Stack
from shared.codec import RequestEntry, dumps
from shared.job_states import JobStatus
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import GROUP, RECENT_KEPT, RECENT_SLACK, Keys
from shared.model_repository import ModelConfig, QueueLimits
from shared.variant_stats import VariantStats
from tests.conftest import REPO_ROOT, running_stack, until
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import Delivery, StreamReader

KEYS = Keys("t:")
CONFIG = ModelConfig(
    name="m",
    kind="batch",
    backend="identity",
    queue=QueueLimits(visibility_timeout_s=0.05, max_deliveries=2),
)
PARTITION = Partition.of(KEYS, CONFIG, "v")
STREAM = PARTITION.online


async def _queued(client: aioredis.Redis, *job_ids: str, inflight: str = "") -> JobStore:
    """Jobs queued on STREAM; each holding a slot of `inflight` when named, as admission left
    it."""
    store = JobStore(client, KEYS, ttl_s=60)
    for job_id in job_ids:
        entry = RequestEntry(job_id, {"inputs": {"x": job_id}}, now_ms(), inflight=inflight)
        if inflight:
            await client.zadd(inflight, {job_id: now_ms()})
        await store.create(entry, STREAM, {"model": "m", "variant": "v"})
    return store


@pytest.fixture
async def writers(aredis: aioredis.Redis) -> AsyncIterator[Callable[[str], ResultWriter]]:
    """Result writers named for their consumers, closed at the end (their statistics sent)."""
    made: list[ResultWriter] = []

    def writer(consumer: str) -> ResultWriter:
        made.append(ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), consumer))
        return made[-1]

    yield writer
    for each in made:
        await each.close()


async def _read(client: aioredis.Redis, consumer: str) -> list[Delivery]:
    reader = StreamReader(client, KEYS, PARTITION.streams, consumer)
    await reader.ensure_groups()
    batches = await reader.wait([STREAM], 100, 100)
    return [d for _, deliveries in batches for d in deliveries]


async def _history(store: JobStore, job_id: str) -> list[dict[str, Any]]:
    record = await store.get(job_id)
    assert record is not None
    history: list[dict[str, Any]] = record.view(history=True)["attempt_history"]
    return history


async def test_finish_records_who_ran_it_when_and_how_it_ended(
    aredis: aioredis.Redis, writers: Callable[[str], ResultWriter]
) -> None:
    store = await _queued(aredis, "ok", "bad")
    ok, bad = await _read(aredis, "box-1-4242")
    error = {"type": "ValueError", "message": "poison"}
    writer = writers("box-1-4242")
    await writer.finish(
        STREAM,
        [
            PARTITION.finish(ok, JobStatus.SUCCEEDED, {"outputs": "{}"}),
            PARTITION.finish(bad, JobStatus.FAILED, {"error": dumps(error).decode()}),
        ],
    )

    (run,) = await _history(store, "ok")
    assert run.pop("started") <= run.pop("ended")
    assert run == {"consumer": "box-1-4242", "host": "box-1", "pid": 4242, "outcome": "succeeded"}
    (failed,) = await _history(store, "bad")
    assert failed["outcome"] == "failed" and failed["error"] == error
    record = await store.get("ok")
    assert record is not None and "attempt_history" not in record.view()  # only when asked


async def test_ending_a_job_never_shortens_its_records_life(
    aredis: aioredis.Redis, writers: Callable[[str], ResultWriter]
) -> None:
    """A Batch API item's hash is made to outlive its batch's window; its write-back (or a
    cancel) used to cut that to the result TTL, so an item that ended early was gone from the
    output file when the window's end finished the batch."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    fields = {"model": "m", "variant": "v"}
    jobs = [
        NewJob(RequestEntry(job_id, {"inputs": {}}, now_ms()), STREAM, fields, ttl_s=ttl_s)
        for job_id, ttl_s in (("item", 5_000), ("kept", 5_000), ("plain", 0))
    ]
    assert await store.create_many(jobs) == []
    item, _kept, plain = await _read(aredis, "box-1-4242")
    await writers("box-1-4242").finish(
        STREAM, [PARTITION.finish(d, JobStatus.SUCCEEDED, {"outputs": "{}"}) for d in (item, plain)]
    )
    assert await store.settle_many(["kept"], JobStatus.CANCELLED, {}) == 1
    assert await aredis.ttl(KEYS.job("item")) > 4_900
    assert await aredis.ttl(KEYS.job("kept")) > 4_900
    assert 50 < await aredis.ttl(KEYS.job("plain")) <= 60


async def test_a_lanes_recent_list_is_trimmed_back_to_what_the_console_lists(
    aredis: aioredis.Redis, writers: Callable[[str], ResultWriter]
) -> None:
    """The write-back puts ended jobs on the lane's recent list, newest first, and trims it back
    to RECENT_KEPT only once it runs RECENT_SLACK past that (not one LTRIM per micro-batch)."""
    recent = KEYS.recent(STREAM)
    await aredis.rpush(recent, *[f"old-{n}" for n in range(RECENT_KEPT + RECENT_SLACK - 1)])
    await _queued(aredis, "a", "b")
    a, b = await _read(aredis, "box-5-1")
    writer = writers("box-5-1")

    await writer.finish(STREAM, [PARTITION.finish(a, JobStatus.SUCCEEDED, {"outputs": "{}"})])
    assert await aredis.llen(recent) == RECENT_KEPT + RECENT_SLACK  # at the bound: kept whole
    await writer.finish(STREAM, [PARTITION.finish(b, JobStatus.SUCCEEDED, {"outputs": "{}"})])
    assert await aredis.llen(recent) == RECENT_KEPT
    assert await aredis.lrange(recent, 0, 2) == [b"b", b"a", b"old-0"]


async def test_a_write_back_rerun_after_its_reply_was_lost_is_written_once_and_reported_again(
    aredis: aioredis.Redis,
    writers: Callable[[str], ResultWriter],
) -> None:
    """The writer retries a micro-batch's write-back when its reply never came (a torn
    connection, a replica WAIT that timed out): the rerun must report the same results, or the
    writer publishes and notifies nothing for them, and must not write them twice."""
    store = await _queued(aredis, "once")
    (once,) = await _read(aredis, "box-3-9")
    writer = writers("box-3-9")
    batch = [PARTITION.finish(once, JobStatus.SUCCEEDED, {"outputs": "{}"})]

    first = await writer.finish(STREAM, batch)
    await aredis.config_resetstat()
    rerun = await writer.finish(STREAM, batch)
    # the rerun writes (a replica WAIT behind it, on its connection, counts the result then)
    assert (await aredis.info("commandstats"))["cmdstat_hset"]["calls"] == 1

    assert [f.job_id for f in first] == [f.job_id for f in rerun] == ["once"]
    record = await store.get("once")
    assert record is not None and record.fields["writes"] == "1"
    assert [run["outcome"] for run in await _history(store, "once")] == ["succeeded"]
    assert await aredis.lrange(KEYS.recent(STREAM), 0, -1) == [b"once"]
    drained = await aredis.keys(KEYS.drained(STREAM, 0).rsplit(":", 1)[0] + ":*")
    assert [await aredis.get(key) for key in drained] == [b"1"]
    # another result for the job (the same again from a second run, or another one) is refused
    for status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        again = [PARTITION.finish(once, status, {"outputs": "{}"})]
        assert await writer.finish(STREAM, again) == []


async def test_write_backs_and_cancels_run_on_a_server_that_lost_its_scripts(
    aredis: aioredis.Redis,
    writers: Callable[[str], ResultWriter],
) -> None:
    """Their pipelines send EVALSHA with no SCRIPT EXISTS first: a server restarted since the
    scripts were loaded refuses them (NOSCRIPT, nothing ran), and the pipeline runs again."""
    store = await _queued(aredis, "written", "cancelled")
    written, _ = await _read(aredis, "box-6-2")
    writer = writers("box-6-2")
    await aredis.script_flush()
    batch = [PARTITION.finish(written, JobStatus.SUCCEEDED, {"outputs": "{}"})]
    assert [f.job_id for f in await writer.finish(STREAM, batch)] == ["written"]
    await aredis.script_flush()
    assert (await store.transition("cancelled", JobStatus.CANCELLED)).status == "cancelled"
    assert [run["outcome"] for run in await _history(store, "written")] == ["succeeded"]


async def test_cancel_and_expiry_end_the_running_attempt(
    aredis: aioredis.Redis, writers: Callable[[str], ResultWriter]
) -> None:
    store = await _queued(aredis, "cancel-me", "expire-me", "queued")
    deliveries = await _read(aredis, "box-2-7")
    reader = StreamReader(aredis, KEYS, PARTITION.streams, "box-2-7")
    await reader.mark_running(deliveries[:2])

    await store.transition("cancel-me", JobStatus.CANCELLED)
    deadline = {"type": "DeadlineExceeded", "message": "too late"}
    await store.transition("expire-me", JobStatus.EXPIRED, {"error": dumps(deadline).decode()})
    await store.transition("queued", JobStatus.CANCELLED)  # never handed over: no attempt

    (cancelled,) = await _history(store, "cancel-me")
    assert cancelled["outcome"] == "cancelled" and cancelled["consumer"] == "box-2-7"
    assert cancelled["started"] == deliveries[0].claimed_ms / 1000 <= cancelled["ended"]
    (expired,) = await _history(store, "expire-me")
    assert expired["outcome"] == "expired" and expired["error"] == deadline
    assert await _history(store, "queued") == []
    # the worker's result after a cancel is refused, and adds no attempt
    writer = writers("box-2-7")
    await writer.finish(STREAM, [PARTITION.finish(deliveries[0], JobStatus.SUCCEEDED, {})])
    assert [run["outcome"] for run in await _history(store, "cancel-me")] == ["cancelled"]


async def test_a_generation_cancelled_while_it_ran_keeps_what_it_ran_to(
    aredis: aioredis.Redis, writers: Callable[[str], ResultWriter]
) -> None:
    """The generate loop aborts a job the API cancelled and writes it back `cancelled` with its
    text so far: the record gains those outputs and token counts, and keeps the cancel's status,
    end and attempt; no write is counted and nothing is reported written (the cancel replied and
    notified), also when the write-back runs again after its reply was lost."""
    store = await _queued(aredis, "stopped")
    (delivery,) = await _read(aredis, "box-3-9")
    await StreamReader(aredis, KEYS, PARTITION.streams, "box-3-9").mark_running([delivery])
    cancelled = await store.transition("stopped", JobStatus.CANCELLED)
    outputs = {"text": "Once upon", "finish_reason": "abort"}
    ran = {"outputs": dumps(outputs).decode(), "completion_tokens": "2"}
    finish = PARTITION.finish(delivery, JobStatus.CANCELLED, ran)
    writer = writers("box-3-9")
    for _ in range(2):
        assert await writer.finish(STREAM, [finish]) == []
        record = await store.get("stopped")
        assert record is not None
        view = record.view(history=True)
        assert view["status"] == "cancelled" and view["outputs"] == outputs
        assert view["completion_tokens"] == 2
        assert record.fields["finished"] == cancelled.fields["finished"]
        assert "writes" not in record.fields and "write_id" not in record.fields
        assert [run["outcome"] for run in view["attempt_history"]] == ["cancelled"]
    assert await aredis.lrange(KEYS.recent(STREAM), 0, -1) == [b"stopped"]
    # its entry is acknowledged and deleted, as any written back
    assert await aredis.xlen(STREAM) == 0


async def test_reclaim_records_the_crashed_attempt_then_the_dead_lettered_one(
    aredis: aioredis.Redis,
) -> None:
    store = await _queued(aredis, "orphan")
    assert len(await _read(aredis, "lost-host-11")) == 1  # delivery 1, never finished

    async def reclaim(consumer: str) -> list[Delivery]:
        await asyncio.sleep(0.1)  # past the 50 ms visibility timeout
        reclaimer = Reclaimer(aredis, KEYS, PARTITION, consumer, 60, JobEvents("redis://unused"))
        return await reclaimer.reclaim(STREAM)

    (second,) = await reclaim("rescuer-22")  # delivery 2: rescuer-22 runs it, then dies too
    assert second.redelivered and second.attempts == 2
    (crashed,) = await _history(store, "orphan")
    assert crashed["outcome"] == "crashed" and crashed["consumer"] == "lost-host-11"
    assert (crashed["host"], crashed["pid"]) == ("lost-host", 11)
    assert crashed["error"]["type"] == "WorkerLost"
    # idle since its last sign of life, not since the attempt began (a reclaim resets it)
    assert crashed["error"]["message"].startswith("no sign of life from lost-host-11 for ")
    assert crashed["error"]["message"].endswith(" ms; taken over by rescuer-22")
    # from its delivery (now - idle) to the takeover: at least the visibility timeout
    assert crashed["ended"] - crashed["started"] >= 0.05
    assert crashed["ended"] == second.claimed_ms / 1000

    assert await reclaim("third-33") == []  # delivery 3 > max_deliveries 2: dead-lettered
    runs = await _history(store, "orphan")
    assert [(r["consumer"], r["outcome"]) for r in runs] == [
        ("lost-host-11", "crashed"),
        ("rescuer-22", "dead-lettered"),
    ]
    assert runs[1]["error"]["type"] == "DeadLettered"
    assert runs[1]["started"] == second.claimed_ms / 1000  # when rescuer-22 marked it running
    # an error of its variant: a canary whose variant crashes its workers was read as healthy
    window = (await VariantStats(aredis, KEYS).window("m", ["v"], time.time() - 60))["v"]
    assert (window.requests, window.errors) == (1, 1)


async def test_an_outage_after_reclaim_committed_keeps_the_claimed_entries(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RECLAIM claimed the entry (delivery 2); an outage in what follows it (here its consumer
    pruning) raised the claim away: the entry came back through the pending list as a first
    delivery, and a generation's stream got no `restart`."""
    await _queued(aredis, "stranded")
    assert len(await _read(aredis, "gone-host-12")) == 1
    await asyncio.sleep(0.1)  # past the 50 ms visibility timeout
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "rescuer-23", 60, JobEvents("redis://unused"))

    async def unreachable(stream: str) -> list[str]:
        raise RedisConnectionError("connection lost after RECLAIM")

    monkeypatch.setattr(reclaimer, "prune_consumers", unreachable)
    (claimed,) = await reclaimer.reclaim(STREAM)
    assert claimed.redelivered and claimed.attempts == 2
    assert claimed.entry is not None and claimed.entry.job_id == "stranded"


async def _taken_over(
    client: aioredis.Redis, job_id: str, inflight: str = ""
) -> tuple[JobStore, Delivery, Delivery]:
    """`job_id` read by hA-1, which then lost Redis past the visibility timeout, and its entry
    taken over by hB-2: (store, hA-1's delivery, hB-2's)."""
    store = await _queued(client, job_id, inflight=inflight)
    (late,) = await _read(client, "hA-1")
    await asyncio.sleep(0.1)  # past the 50 ms visibility timeout
    reclaimer = Reclaimer(client, KEYS, PARTITION, "hB-2", 60, JobEvents("redis://unused"))
    (rescued,) = await reclaimer.reclaim(STREAM)
    return store, late, rescued


async def _new_owner_finishes(
    store: JobStore, writer: ResultWriter, rescued: Delivery, job_id: str
) -> None:
    """hB-2's result is written, and the job's history is hA-1's crash then hB-2's success."""
    done = PARTITION.finish(rescued, JobStatus.SUCCEEDED, {"outputs": "{}"})
    assert [f.job_id for f in await writer.finish(STREAM, [done])] == [job_id]
    assert [(r["consumer"], r["outcome"]) for r in await _history(store, job_id)] == [
        ("hA-1", "crashed"),
        ("hB-2", "succeeded"),
    ]


async def test_a_result_written_after_a_takeover_leaves_the_job_to_its_new_owner(
    aredis: aioredis.Redis, writers: Callable[[str], ResultWriter]
) -> None:
    """hA-1 lost Redis past the visibility timeout and hB-2 took its entry over: hA-1's late
    result was written all the same (its attempt on record twice, crashed then succeeded) and
    acknowledged the entry hB-2 held, whose own result was then refused. The new owner's
    stands: the late one writes nothing and leaves the entry pending for it, and the job keeps
    its API key's in-flight slot (freed beside the refused write-back, it was one job under its
    limit while hB-2 ran it)."""
    slots = KEYS.in_flight("key-1")
    store, late, rescued = await _taken_over(aredis, "taken", inflight=slots)

    done = {"outputs": "{}"}
    assert (
        await writers("hA-1").finish(STREAM, [PARTITION.finish(late, JobStatus.SUCCEEDED, done)])
        == []
    )
    record = await store.get("taken")
    assert record is not None and record.status == JobStatus.RUNNING
    assert [(r["consumer"], r["outcome"]) for r in await _history(store, "taken")] == [
        ("hA-1", "crashed")
    ]
    pending = await aredis.xpending_range(STREAM, GROUP, "-", "+", 10)
    assert [(row["message_id"], row["consumer"]) for row in pending] == [(late.entry_id, b"hB-2")]
    assert await aredis.zscore(slots, "taken") is not None

    await _new_owner_finishes(store, writers("hB-2"), rescued, "taken")
    assert await aredis.xlen(STREAM) == 0
    assert await aredis.zscore(slots, "taken") is None


async def test_a_mark_that_lands_after_a_takeover_leaves_the_job_to_its_new_owner(
    aredis: aioredis.Redis, writers: Callable[[str], ResultWriter]
) -> None:
    """hA-1, cut off past the visibility timeout, retries its long run's mark once Redis is back
    (workers/batching/long_run.py), after hB-2 took the entry over: the mark set the job's
    worker back to hA-1, and hA-1's late result was then written as its own. A mark from an
    earlier delivery than the running one changes nothing."""
    store, late, rescued = await _taken_over(aredis, "marked-late")
    assert (late.attempts, rescued.attempts) == (1, 2)

    await StreamReader(aredis, KEYS, PARTITION.streams, "hA-1").mark_running([late])
    assert await aredis.hmget(KEYS.job("marked-late"), "worker", "attempts") == [b"hB-2", b"2"]

    late_finish = PARTITION.finish(late, JobStatus.SUCCEEDED, {"outputs": "{}"})
    assert await writers("hA-1").finish(STREAM, [late_finish]) == []
    await _new_owner_finishes(store, writers("hB-2"), rescued, "marked-late")


# --- through the API and the SDK, with a real worker -------------------------------------------

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"


@pytest.fixture(scope="module")
def faulty_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, int]]:
    with running_stack(
        tmp_path_factory.mktemp("attempts"),
        CONVEYOR_MODEL_REPOSITORY=str(FIXTURES),
        PYTHONPATH=str(REPO_ROOT),  # the fault engine lives in tests/
        CONVEYOR_AUTH="disabled",
    ) as stack:
        yield stack, stack.start_worker("faulty", name="attempts")


def _submit(base_url: str, inputs: dict[str, Any], **body: Any) -> str:
    response = httpx.post(f"{base_url}/v1/jobs", json={"model": "faulty", "inputs": inputs, **body})
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


@pytest.mark.slow
def test_api_and_sdk_return_each_attempt(faulty_stack: tuple[Stack, int]) -> None:
    stack, pid = faulty_stack
    worker = {"consumer": stack.consumer_name(pid), "host": socket.gethostname(), "pid": pid}
    url = stack.base_url
    ok = _submit(url, {"n": 1})
    bad = _submit(url, {"action": "raise", "tag": "t-1"})
    slow = _submit(url, {"sleep_ms": 1500})
    until(lambda: httpx.get(f"{url}/v1/jobs/{slow}").json()["status"] == "running")
    late = _submit(url, {"n": 2}, ttl_s=0.3)  # waits behind `slow` past its deadline
    assert httpx.delete(f"{url}/v1/jobs/{slow}").json()["status"] == "cancelled"

    with Client(url) as client:
        jobs = {job_id: client.wait(job_id, 60, attempts=True) for job_id in (ok, bad, late)}
        jobs[slow] = client.get(slow, attempts=True)
        assert client.get(ok).attempt_history is None  # the default view is unchanged
    outcomes = {job_id: job.attempt_history for job_id, job in jobs.items()}
    for history in outcomes.values():
        assert history is not None and len(history) == 1
        (run,) = history
        assert run.model_dump(include={"consumer", "host", "pid"}) == worker
        assert run.started is not None and run.ended is not None and run.started <= run.ended
    ended = [
        (run.outcome, run.error and run.error.type)
        for job in jobs.values()
        for run in job.attempt_history or []
    ]
    assert ended == [
        ("succeeded", None),
        ("failed", "ValueError"),
        ("expired", "DeadlineExceeded"),
        ("cancelled", None),
    ]

    async def read_async() -> list[str]:
        async with AsyncClient(url) as client:
            job = await client.get(ok, attempts=True)
        return [run.outcome for run in job.attempt_history or []]

    assert asyncio.run(read_async()) == ["succeeded"]
    raw = httpx.get(f"{url}/v1/jobs/{ok}", params={"attempts": "true"}).json()
    assert raw["attempt_history"][0]["outcome"] == "succeeded" and raw["attempts"] == 1
    assert "attempt_history" not in httpx.get(f"{url}/v1/jobs/{ok}").json()


@pytest.mark.parametrize("value", ["yes", "1", "True", ""])
def test_attempts_other_than_true_or_false_is_refused(
    faulty_stack: tuple[Stack, int], value: str
) -> None:
    stack, _ = faulty_stack
    job_id = _submit(stack.base_url, {"n": 3})
    response = httpx.get(f"{stack.base_url}/v1/jobs/{job_id}", params={"attempts": value})
    assert response.status_code == 422, response.text
    assert "attempts" in response.text


async def test_a_broker_that_refuses_a_webhook_costs_the_event_not_the_write_back(
    aredis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Celery's publish to a broker it cannot reach raises kombu's OperationalError after its
    retries: raised out of the write-back, it ended the worker's loop with the batch written."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    for job_id in ("hooked-1", "hooked-2"):
        payload = {"inputs": {}, "webhook": "http://127.0.0.1:9/hook"}
        await store.create(RequestEntry(job_id, payload, now_ms()), STREAM, {"model": "m"})
    deliveries = await _read(aredis, "box-9-1")
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://127.0.0.1:9/0"), "box-9-1")
    finishes = [PARTITION.finish(d, JobStatus.SUCCEEDED, {"outputs": "{}"}) for d in deliveries]
    with caplog.at_level(logging.ERROR, logger="workers.partition.job_events"):
        written = await writer.finish(STREAM, finishes)
    await writer.close()
    assert sorted(f.job_id for f in written) == ["hooked-1", "hooked-2"]
    refused = [r.getMessage() for r in caplog.records if "not handed to delivery" in r.getMessage()]
    # the first refusal ends the hand-over: the other event stays owed, for the reclaimer
    assert len(refused) == 1 and "job.succeeded" in refused[0], refused
    for job_id in ("hooked-1", "hooked-2"):
        record = await store.get(job_id)
        assert record is not None and record.status == JobStatus.SUCCEEDED


async def test_each_finished_jobs_lane_goes_into_its_variants_samples(
    aredis: aioredis.Redis, writers: Callable[[str], ResultWriter]
) -> None:
    """A canary's p99 leaves out the bulk lane's jobs (Batch API items wait behind online work
    by design): the writer marks each finished job's lane in its variant's samples."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    for job_id, stream in (("lane-on", PARTITION.online), ("lane-bulk", PARTITION.bulk)):
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, stream, {"model": "m", "variant": "v"})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, "lanes-1")
    await reader.ensure_groups()
    writer = writers("lanes-1")
    for stream, deliveries in await reader.wait(list(PARTITION.streams), 10, 100):
        done = [PARTITION.finish(d, JobStatus.SUCCEEDED, {"outputs": "{}"}) for d in deliveries]
        assert len(await writer.finish(stream, done)) == 1
    await writer.close()
    window = (await VariantStats(aredis, KEYS).window("m", ["v"], time.time() - 60))["v"]
    assert sorted(sample.bulk for sample in window.samples) == [False, True]

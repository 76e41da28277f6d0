"""The job state machine, checked against a real server: legal moves pass, illegal ones are
refused atomically, terminal states never change, hashes expire. Jobs created in one event-loop
turn share one script call, and each is admitted as if it came alone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer_api.jobs.group_commit import group_committing
from shared import job_scripts
from shared import job_store as job_store_module
from shared.codec import RequestEntry
from shared.job_states import TERMINAL, TRANSITIONS, IllegalTransition, JobStatus
from shared.job_store import (
    JobNotFound,
    JobStore,
    NewJob,
    QueueFull,
    TooFarBack,
    merged_enqueues,
    now_ms,
)
from shared.keys import GROUP, UNCOUNTED_SUFFIX, Keys

KEYS = Keys("t:")


async def _queued(aredis: aioredis.Redis, job_id: str) -> JobStore:
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry(job_id=job_id, payload={"inputs": {}}, enqueued_ms=now_ms())
    await store.create(entry, KEYS.queue("m", "v"), {"model": "m", "variant": "v"})
    return store


def test_terminal_states_allow_nothing() -> None:
    assert not any(TRANSITIONS.get(state) for state in TERMINAL)
    assert JobStatus.RUNNING in TRANSITIONS[JobStatus.QUEUED]
    assert JobStatus.SUCCEEDED in TRANSITIONS[JobStatus.RUNNING]
    assert JobStatus.SUCCEEDED not in TRANSITIONS[JobStatus.QUEUED]


async def test_create_writes_hash_and_entry_together(aredis: aioredis.Redis) -> None:
    store = await _queued(aredis, "a1")
    record = await store.get("a1")
    assert record is not None and record.status is JobStatus.QUEUED
    entries = await aredis.xrange(KEYS.queue("m", "v"))
    assert [fields[b"id"] for _, fields in entries] == [b"a1"]
    assert 0 < await aredis.ttl(KEYS.job("a1")) <= 60


async def test_a_retried_create_enqueues_nothing_twice(aredis: aioredis.Redis) -> None:
    """A create retried after its reply was lost (a torn connection) finds the job's hash:
    no second entry, and a job that ended meanwhile is not queued again."""
    store = await _queued(aredis, "a5")
    await store.transition("a5", JobStatus.CANCELLED)
    entry = RequestEntry(job_id="a5", payload={"inputs": {}}, enqueued_ms=now_ms())
    await aredis.config_resetstat()
    await store.create(entry, KEYS.queue("m", "v"), {"model": "m", "variant": "v"})
    # it writes (a replica WAIT behind it, on its own connection, counts the job then)
    assert (await aredis.info("commandstats"))["cmdstat_hset"]["calls"] == 1
    assert await aredis.xlen(KEYS.queue("m", "v")) == 0  # the cancel withdrew it; none again
    assert await aredis.hget(KEYS.job("a5"), "status") == b"cancelled"


async def test_transition_refuses_leaving_a_terminal_state(aredis: aioredis.Redis) -> None:
    store = await _queued(aredis, "a2")
    cancelled = await store.transition("a2", JobStatus.CANCELLED)
    assert cancelled.status is JobStatus.CANCELLED and "finished" in cancelled.fields
    with pytest.raises(IllegalTransition) as info:
        await store.transition("a2", JobStatus.RUNNING)
    assert info.value.current == "cancelled"
    record = await store.get("a2")
    assert record is not None and record.status is JobStatus.CANCELLED


async def test_transition_of_unknown_job(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    with pytest.raises(JobNotFound):
        await store.transition("nope", JobStatus.CANCELLED)


async def test_transition_publishes_the_view(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry("a3", {"inputs": {}}, now_ms(), reply="t:reply:p1")
    await store.create(entry, KEYS.queue("m", "v"), {"model": "m", "variant": "v"})
    pubsub = aredis.pubsub(ignore_subscribe_messages=True)
    await pubsub.ssubscribe("t:reply:p1")
    await store.transition("a3", JobStatus.CANCELLED)
    message = None
    for _ in range(50):
        message = await pubsub.get_message(timeout=0.1)
        if message:
            break
    await pubsub.aclose()
    assert message is not None and b'"status":"cancelled"' in message["data"]


# (job, tenant, max_ahead): a retry of job 1 (its reply lost), a deadline only an empty lane
# meets, one a short queue meets, and more jobs than the lane's max_length admits.
TURN = [(0, "a", -1), (1, "a", -1), (1, "a", -1), (2, "b", 0), (3, "b", 5), (4, "a", -1)]
TURN += [(5, "b", -1), (6, "a", -1)]
MAX_LENGTH = 5


async def _create_turn(store: JobStore, stream: str, window: int, together: bool) -> list[object]:
    """TURN's creates on `stream` (a fair lane when `window`): one after another, or all in one
    event-loop turn. Each one's queue position, or how it was refused."""

    async def create(job: int, tenant: str, max_ahead: int) -> object:
        entry = RequestEntry(f"{stream}-{job}", {"inputs": {}}, now_ms(), tenant=tenant)
        fields = {"model": "m", "variant": "v"}
        try:
            return await store.create(entry, stream, fields, MAX_LENGTH, max_ahead, (window, 1.0))
        except QueueFull:
            return "full"
        except TooFarBack:
            return "too far back"

    if together:
        return list(await asyncio.gather(*(create(*spec) for spec in TURN)))
    return [await create(*spec) for spec in TURN]


async def _lane_state(aredis: aioredis.Redis, stream: str) -> dict[str, object]:
    """What a lane holds, its jobs named by their number in TURN."""

    def number(job_id: bytes) -> int:
        return int(job_id.decode().rpartition("-")[2])

    entries = [number(f[b"id"]) for _, f in await aredis.xrange(stream)]
    held = {t: await aredis.llen(f"{stream}:held:{t}") for t in ("a", "b")}
    hashes = {}
    for job in sorted({spec[0] for spec in TURN}):
        fields = await aredis.hmget(KEYS.job(f"{stream}-{job}"), "status", "seq", "held")
        hashes[job] = fields
    added = await aredis.get(KEYS.added(stream))
    return {"entries": entries, "held": held, "hashes": hashes, "added": added}


@pytest.mark.parametrize("window", [0, 2])
async def test_creates_of_one_turn_are_one_call_admitted_as_if_alone(
    aredis: aioredis.Redis, window: int
) -> None:
    """Concurrent submits to a lane (here plain, and fair with jobs held back) cost one ENQUEUE
    call between them on the producer's group-committing client, with the same outcome as the
    same creates one by one: the same entries, hashes, sequence numbers and lane counter; a
    plain lane's counter moves by one INCRBY for the whole call, and one more that gives back
    the numbers its refused jobs left unused."""
    hot = group_committing(aredis, "", "hot", {job_scripts.ENQUEUE: merged_enqueues})
    store = JobStore(hot, KEYS, ttl_s=60)
    alone = await _create_turn(store, KEYS.queue("m", "alone"), window, together=False)
    await aredis.config_resetstat()
    together = await _create_turn(store, KEYS.queue("m", "together"), window, together=True)
    stats = await aredis.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 1
    if window == 0:
        assert "cmdstat_incr" not in stats and stats["cmdstat_incrby"]["calls"] == 2
    assert together == alone
    assert "full" in alone and "too far back" in alone and alone[2] == 0
    expected = await _lane_state(aredis, KEYS.queue("m", "alone"))
    assert await _lane_state(aredis, KEYS.queue("m", "together")) == expected
    assert sum(expected["held"].values()) == (0 if window == 0 else 3)  # type: ignore[attr-defined]


async def test_a_merged_create_outlives_a_server_that_lost_its_scripts(
    aredis: aioredis.Redis,
) -> None:
    """The merged call is refused (NOSCRIPT): the script is loaded and the same merged call
    sent again, not each create by itself, merged anew with others (a call that ran before its
    reply was lost must be rerun whole for ENQUEUE to know it: its first job's hash is what it
    looks for), so ENQUEUE ran once for the four, with one EXISTS."""
    hot = group_committing(aredis, "", "hot", {job_scripts.ENQUEUE: merged_enqueues})
    store = JobStore(hot, KEYS, ttl_s=60)
    stream = KEYS.queue("m", "restarted")
    await aredis.script_flush()
    await aredis.config_resetstat()

    async def create(job: int) -> int:
        entry = RequestEntry(f"r-{job}", {"inputs": {}}, now_ms())
        return await store.create(entry, stream, {"model": "m", "variant": "v"})

    positions = await asyncio.gather(*(create(job) for job in range(4)))
    assert sorted(positions) == [0, 1, 2, 3]
    stats = await aredis.info("commandstats")
    assert stats["cmdstat_exists"]["calls"] == 1 and stats["cmdstat_script|load"]["calls"] == 1
    assert sorted(f[b"id"] for _, f in await aredis.xrange(stream)) == [
        b"r-0",
        b"r-1",
        b"r-2",
        b"r-3",
    ]


async def test_a_cancel_rerun_after_its_reply_was_lost_is_still_its_own(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py reruns a pipeline whose connection dropped before the reply: the rerun found
    the job cancelled (by the first run) and the cancel answered 409 "already cancelled",
    with no job.cancelled webhook. A cancel of a job another call ended is still refused."""
    store = await _queued(aredis, "lost-reply")
    ran = job_store_module.run_pipeline

    async def rerun_after_a_lost_reply(*args: Any, **kwargs: Any) -> Any:
        await ran(*args, **kwargs)  # the server ran it; its reply never came back
        return await ran(*args, **kwargs)

    monkeypatch.setattr(job_store_module, "run_pipeline", rerun_after_a_lost_reply)
    record = await store.transition("lost-reply", JobStatus.CANCELLED)
    assert record.status == JobStatus.CANCELLED
    monkeypatch.undo()
    with pytest.raises(IllegalTransition):
        await store.transition("lost-reply", JobStatus.CANCELLED)


async def test_two_cancels_in_one_millisecond_are_one_cancel_and_one_refusal(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two DELETEs (a client retrying in parallel, two producers) in the same millisecond: the
    loser took the winner's `finished` stamp for its own, and both answered 200 and sent the
    job.cancelled webhook."""
    store = await _queued(aredis, "same-ms")
    monkeypatch.setattr(job_store_module, "now_ms", lambda: 1_700_000_000_000)
    assert (await store.transition("same-ms", JobStatus.CANCELLED)).status == JobStatus.CANCELLED
    with pytest.raises(IllegalTransition):
        await store.transition("same-ms", JobStatus.CANCELLED)


async def test_one_exists_per_create_call_tells_a_rerun_even_when_its_first_job_was_refused(
    aredis: aioredis.Redis,
) -> None:
    """A call of many jobs looks for one hash (its first job's, or that job's refusal marker),
    not one per job; its rerun (the same call, its reply lost) finds what the first run did
    and enqueues nothing twice, also when the first run refused the first job and accepted
    the rest."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    stream = KEYS.queue("m", "calls")
    await store.create(RequestEntry("ahead", {"inputs": {}}, now_ms()), stream, {"model": "m"})
    jobs = [NewJob(RequestEntry(f"c{i}", {"inputs": {}}, now_ms()), stream, {}) for i in range(4)]
    calls = [store.enqueue_call(job, 0, 0 if i == 0 else -1) for i, job in enumerate(jobs)]
    [((keys, args), _)] = merged_enqueues(calls)
    script = aredis.register_script(job_scripts.ENQUEUE)
    await aredis.config_resetstat()
    first = await script(keys, args)
    assert (await aredis.info("commandstats"))["cmdstat_exists"]["calls"] == 1
    again = await script(keys, args)
    assert [reply[0] for reply in first] == [2, 1, 1, 1]  # c0: too far back for its deadline
    assert [reply[0] for reply in again] == [2, 1, 1, 1]
    assert [reply[2] for reply in again[1:]] == [reply[2] for reply in first[1:]]
    entries = [fields[b"id"] for _, fields in await aredis.xrange(stream)]
    assert entries == [b"ahead", b"c1", b"c2", b"c3"]


async def test_a_refused_lone_create_writes_nothing(aredis: aioredis.Redis) -> None:
    """A refusal (a full queue, a deadline the queue cannot meet: the 429s of an overload)
    changes nothing: the rerun marker is left only by a call that also wrote a later job."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    stream = KEYS.queue("m", "refusals")
    await store.create(RequestEntry("first", {"inputs": {}}, now_ms()), stream, {"model": "m"})
    keys = await aredis.dbsize()
    with pytest.raises(TooFarBack):
        await store.create(RequestEntry("late", {"inputs": {}}, now_ms()), stream, {}, 0, 0)
    with pytest.raises(QueueFull):
        await store.create(RequestEntry("full", {"inputs": {}}, now_ms()), stream, {}, 1)
    assert await aredis.dbsize() == keys


async def test_a_replayed_id_is_looked_for_wherever_it_stands_in_a_call(
    aredis: aioredis.Redis,
) -> None:
    """A dead letter's replay id (the same for every replay) may exist already: its create is
    marked may_exist, and a call that holds it behind a new job still enqueues it once."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    stream = KEYS.queue("m", "replays")
    await store.create(RequestEntry("replayed", {"inputs": {}}, now_ms()), stream, {})
    jobs = [
        NewJob(RequestEntry("new", {"inputs": {}}, now_ms()), stream, {}),
        NewJob(RequestEntry("replayed", {"inputs": {}}, now_ms()), stream, {}, may_exist=True),
    ]
    [((keys, args), _)] = merged_enqueues([store.enqueue_call(job, 0) for job in jobs])
    await aredis.register_script(job_scripts.ENQUEUE)(keys, args)
    entries = [fields[b"id"] for _, fields in await aredis.xrange(stream)]
    assert entries == [b"replayed", b"new"]


@pytest.mark.parametrize("marked", ["both", "expired", "hash"])
async def test_a_held_job_that_ends_no_longer_counts_toward_the_lanes_length(
    aredis: aioredis.Redis, marked: str
) -> None:
    """A fair lane counts the jobs it holds back against `max_length`; one cancelled while held
    went on counting until its tenant's turn dropped it, so cancelled jobs kept refusing new
    ones. Refill still drops their entries, and the count stays that of the live held jobs,
    also once the cancelled jobs' hashes have expired (`expired`: the lane's set remembers
    them; the count went one short for each, refill stopped before the live job, and every
    later refill found nothing held), and for jobs a producer before the set ended (`hash`:
    only their hashes' mark, which this one writes too, for workers before the set)."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    stream = KEYS.queue("m", f"held-ends-{marked}")
    await aredis.xgroup_create(stream, GROUP, "0", mkstream=True)

    async def create(job_id: str, tenant: str = "a") -> int:
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms(), tenant=tenant)
        return await store.create(entry, stream, {"model": "m"}, 3, -1, (1, 1.0))

    for job_id in ("in-stream", "held-1", "held-2"):  # a window of 1: the last two are held
        await create(job_id)
    with pytest.raises(QueueFull):
        await create("refused")
    for job_id in ("held-1", "held-2"):
        await store.transition(job_id, JobStatus.CANCELLED)
        assert await aredis.hget(KEYS.job(job_id), "held") == b"uncounted"
        if marked == "expired":  # what their TTL does, before refill reaches their entries
            await aredis.delete(KEYS.job(job_id))
        if marked == "hash":
            await aredis.srem(f"{stream}{UNCOUNTED_SUFFIX}", job_id)
    await create("after", "b")  # another tenant's: its turn comes after a's
    assert await aredis.hget(KEYS.fair(stream), "held") == b"1"
    take = aredis.register_script(job_scripts.TAKE)
    _, rows = await take(keys=[stream], args=[GROUP, "c1", 10, KEYS.job_prefix, now_ms(), ""])
    read = [dict(zip(fields[::2], fields[1::2], strict=True))[b"id"] for _, fields, _ in rows]
    assert read == [b"in-stream", b"after"]  # the cancelled ones dropped, never delivered
    assert await aredis.hget(KEYS.fair(stream), "held") == b"0"
    assert [await aredis.llen(KEYS.held(stream, tenant)) for tenant in "ab"] == [0, 0]
    assert not await aredis.exists(f"{stream}{UNCOUNTED_SUFFIX}")  # nothing left behind


async def test_a_merged_create_that_cannot_be_sent_again_fails_alone(
    aredis: aioredis.Redis,
) -> None:
    """When the script cannot be loaded again (refused here: NOPERM), only the creates of the
    refused call fail; the other commands of their flush ran and answer as ever."""
    hot = group_committing(aredis, "", "hot", {job_scripts.ENQUEUE: merged_enqueues})
    store = JobStore(hot, KEYS, ttl_s=60)
    entry = RequestEntry("unsent", {"inputs": {}}, now_ms())
    await aredis.script_flush()
    await aredis.execute_command("ACL", "SETUSER", "default", "-script|load")
    try:
        created, other = await asyncio.gather(
            store.create(entry, KEYS.queue("m", "unloadable"), {"model": "m"}),
            hot.set(KEYS.job("beside"), "1"),
            return_exceptions=True,
        )
    finally:
        await aredis.execute_command("ACL", "SETUSER", "default", "+script|load")
    assert isinstance(created, Exception) and other is True
    assert await aredis.get(KEYS.job("beside")) == b"1"

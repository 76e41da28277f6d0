"""A queued job's cancel withdraws its stream entry while no consumer has been handed it, on a
real Valkey with no worker (a pool scaled to zero): the entry stayed until a worker read it
only to skip it, so cancelled jobs went on filling `queue.max_length` (429 for new submits),
other jobs' `queue_position`, and the stream length KEDA scales on. An entry a consumer holds
(in the group's PEL) stays for its worker to acknowledge; positions stay exact on both sides of
a withdrawn entry, and the drain counters count only what workers finished."""

from __future__ import annotations

import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, WITHDRAWN_SUFFIX, Keys
from shared.metrics import JOBS_FINISHED
from shared.queue_position import QueuePositions
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("wd:")
STREAM = KEYS.queue("m", "default")


async def _create(store: JobStore, job_id: str) -> None:
    entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
    await store.create(entry, STREAM, {"model": "m", "variant": "default"}, max_length=5)


async def _ids(client: aioredis.Redis) -> list[bytes]:
    return [fields[b"id"] for _, fields in await client.xrange(STREAM)]


async def test_a_cancel_withdraws_an_entry_no_worker_was_handed(aredis: aioredis.Redis) -> None:
    store, positions = JobStore(aredis, KEYS, 60), QueuePositions(aredis, KEYS)
    await aredis.xgroup_create(STREAM, GROUP, "0", mkstream=True)
    for job_id in "abcde":
        await _create(store, job_id)
    await aredis.xreadgroup(GROUP, "w-1", {STREAM: ">"}, count=1)  # `a` handed over
    for job_id in "abd":
        await store.transition(job_id, JobStatus.CANCELLED)
    assert await _ids(aredis) == [b"a", b"c", b"e"]  # `a`'s stays for its worker to ack
    await _create(store, "f")  # room freed: the lane held max_length entries before
    seqs = {job_id: int(await aredis.hget(KEYS.job(job_id), "seq") or 0) for job_id in "cef"}
    standing = [await positions.position(STREAM, seqs[job_id], "default") for job_id in "cef"]
    assert standing == [0, 1, 2]  # withdrawn entries ahead of a job and behind it alike
    read = await aredis.xreadgroup(GROUP, "w-1", {STREAM: ">"}, count=10)
    assert [fields[b"id"] for _, fields in read[0][1]] == [b"c", b"e", b"f"]
    assert await aredis.keys(f"{STREAM}:drained:*") == []  # no worker finished anything
    await _create(store, "g")
    await store.transition("g", JobStatus.CANCELLED)  # nothing waits now: no position to mend
    assert await _ids(aredis) == [b"a", b"c", b"e", b"f"]
    assert not await aredis.exists(f"{STREAM}{WITHDRAWN_SUFFIX}")


async def test_a_cancel_through_the_api_frees_the_lane_and_counts_the_end(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """No worker reads a withdrawn entry, so the producer that cancelled it counts its end
    (`conveyor_jobs_finished_total{state="cancelled"}`), as the worker skipping it did."""
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="withdraw")
    lane = Keys().queue("identity", "default")
    ended = JOBS_FINISHED.labels("identity", "default", "cancelled")
    async with app_client(create_app(settings)) as client:
        job = (await client.post("/v1/jobs", json={"model": "identity", "inputs": {}})).json()
        counted = ended._value.get()
        cancelled = await client.delete(f"/v1/jobs/{job['id']}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert await aredis.xlen(lane) == 0
    assert ended._value.get() == counted + 1


async def test_a_job_a_fair_lane_moved_in_is_withdrawn_too(aredis: aioredis.Redis) -> None:
    """A fair lane's held job has no entry until refill moves it into the stream; refill names
    the entry in its hash then, so its cancel withdraws it like any other (here a batch's
    settling of its items, also counted as ended: no worker reads it to count it)."""
    store, stream = JobStore(aredis, KEYS, 60), KEYS.queue("m", "fair")
    await aredis.xgroup_create(stream, GROUP, "0", mkstream=True)

    async def create(job_id: str) -> None:
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, stream, {"model": "m"}, 10, -1, (1, 1.0))

    for job_id in "xyz":  # a window of 1: y and z are held
        await create(job_id)
    await aredis.xreadgroup(GROUP, "w-1", {stream: ">"}, count=1)  # x handed over
    await create("w")  # held, and its refill moves y in, the window free
    assert [fields[b"id"] for _, fields in await aredis.xrange(stream)] == [b"x", b"y"]
    ended = JOBS_FINISHED.labels("m", "", "cancelled")
    counted = ended._value.get()
    assert await store.settle_many(["y"], JobStatus.CANCELLED, {}) == 1  # as a batch's items
    assert [fields[b"id"] for _, fields in await aredis.xrange(stream)] == [b"x"]
    assert ended._value.get() == counted + 1

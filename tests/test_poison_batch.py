"""A process-killing input must not take its micro-batch with it: entries taken back from a
crashed worker run one at a time, so only the poison entry keeps killing workers and reaches
the dead letters (README: bad input never loses another job)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from conveyor.stack import Stack
from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from tests.conftest import REPO_ROOT, running_stack, until
from tests.lane_rig import abandoned_after, queue_jobs
from tests.test_faults import FIXTURES, _faulty, _job
from tests.test_lost_reads import _jobs
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.reclaim import Reclaimer
from workers.partition.reclaim_turn import ReclaimTurn
from workers.partition.stream_reader import StreamReader

KEYS = Keys("poison:")
WORKER = "box-7-77"
# Far longer than a test runs: only the dead worker's entries, made idle a minute, are
# abandoned. At 0.2 s, this worker's own (claimed, or read as new work, never written back)
# went idle past it on a busy machine and were reclaimed again out of turn.
VISIBILITY_S = 30


async def _read_by_dead_worker(aredis: aioredis.Redis, stream: str) -> None:
    """Consumer dead-1 read what waits in `stream` a minute ago and died (XCLAIM's IDLE sets
    exactly that idle time): abandoned with no sleep past the visibility timeout."""
    ((_, deliveries),) = await aredis.xreadgroup(GROUP, "dead-1", {stream: ">"})
    await aredis.xclaim(stream, GROUP, "dead-1", 0, [eid for eid, _ in deliveries], idle=60_000)


@pytest.fixture(scope="module")
def poison_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A producer over the test models (`faulty`: visibility timeout 2 s, max_deliveries 2)."""
    with running_stack(
        tmp_path_factory.mktemp("poison"),
        CONVEYOR_MODEL_REPOSITORY=str(FIXTURES),
        PYTHONPATH=str(REPO_ROOT),  # the custom backend lives in tests/
        CONVEYOR_AUTH="disabled",
    ) as stack:
        yield stack


@pytest.mark.slow
def test_a_crashing_entry_does_not_dead_letter_its_batchmates(poison_stack: Stack) -> None:
    bodies = [_faulty({"n": 0}), _faulty({"action": "crash"}), _faulty({"n": 2}), _faulty({"n": 3})]
    ids = [
        httpx.post(f"{poison_stack.base_url}/v1/jobs", json=body).json()["id"] for body in bodies
    ]
    r = redis.Redis.from_url(poison_stack.redis_url, decode_responses=True)

    def ended() -> bool:
        return all(_job(r, i).get("status") in {"succeeded", "failed"} for i in ids)

    exits: list[int] = []
    try:
        # the first worker reads all four in one micro-batch and dies; each later one takes the
        # entries back, until the crashing one is past max_deliveries (the third worker)
        for attempt in range(4):
            name = f"poison-{attempt}"
            poison_stack.start_worker("faulty", name=name)
            worker = poison_stack.processes[name]
            until(lambda: ended() or worker.poll() is not None, timeout=60)  # noqa: B023
            exits.append(poison_stack.stop_process(name))
            if ended():
                break
        jobs = [_job(r, i) for i in ids]
    finally:
        r.close()
    statuses = [j.get("status") for j in jobs]
    assert statuses == ["succeeded", "failed", "succeeded", "succeeded"], (exits, jobs)
    assert "DeadLettered" in jobs[1]["error"]
    assert {j["batch_size"] for j in jobs if j["status"] == "succeeded"} == {"1"}  # alone


async def test_reclaimed_entries_run_one_at_a_time_between_new_work(
    aredis: aioredis.Redis,
) -> None:
    """A dead consumer's three entries come back one per micro-batch, the next claimed only
    once the one before is no longer in hand; new work gets a turn after each, and the whole
    backlog is served without waiting a reclaim interval in between."""
    partition = abandoned_after(KEYS, VISIBILITY_S)
    store = JobStore(aredis, KEYS, ttl_s=60)
    await queue_jobs(store, partition.online, "a0", "a1", "a2")
    reader = StreamReader(aredis, KEYS, partition.streams, WORKER)
    await reader.ensure_groups()
    await _read_by_dead_worker(aredis, partition.online)
    await queue_jobs(store, partition.online, "n0", "n1")
    reclaimer = Reclaimer(aredis, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))
    lanes = LaneScheduler(partition, reader, reclaimer)

    first = await lanes.next_batch(32, 0, 50)
    assert _jobs(first) == ["a0"] and first[0][1][0].redelivered
    running = {(partition.online, first[0][1][0].entry_id)}  # a staged engine still has it
    assert _jobs(await lanes.next_batch(32, 0, 50, running)) == ["n0", "n1"]
    # no second claim meanwhile, and no idle read's whole block either (a minute here): the
    # next is claimed soon after the staged engine writes this one back
    assert await asyncio.wait_for(lanes.next_batch(32, 0, 60_000, running), 10) == []
    served = [_jobs(await lanes.next_batch(32, 0, 50)) for _ in range(5)]
    assert served == [["a1"], [], ["a2"], [], []]


async def test_two_partitions_of_a_worker_run_their_reclaimed_entries_one_at_a_time(
    aredis: aioredis.Redis,
) -> None:
    """A worker serving two models: a dead worker left an entry in each. Both ran at once, so
    when one of them killed the process again, the other was counted a delivery too, and an
    innocent job, killed twice by its neighbour, was dead-lettered. The second partition's
    entry is claimed only once the first's is written back; its new work is not held."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    turn = ReclaimTurn()
    schedulers = []
    for name in ("pa", "pb"):
        partition = abandoned_after(KEYS, VISIBILITY_S, name)
        await queue_jobs(store, partition.online, f"{name}-0")
        reader = StreamReader(aredis, KEYS, partition.streams, WORKER)
        await reader.ensure_groups()
        await _read_by_dead_worker(aredis, partition.online)
        reclaimer = Reclaimer(aredis, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))
        schedulers.append((partition, LaneScheduler(partition, reader, reclaimer, turn)))
    (pa, first), (pb, second) = schedulers
    taken = await first.next_batch(32, 0, 50)
    assert _jobs(taken) == ["pa-0"] and taken[0][1][0].redelivered
    running = {(pa.online, taken[0][1][0].entry_id)}  # the suspect runs
    await queue_jobs(store, pb.online, "pb-new")
    assert _jobs(await second.next_batch(32, 0, 50)) == ["pb-new"]  # new work goes on
    assert _jobs(await second.next_batch(32, 0, 50)) == []  # its reclaim waits
    assert await first.next_batch(32, 0, 50, running) == []
    assert _jobs(await first.next_batch(32, 0, 50)) == []  # written back: the turn is free
    again = await second.next_batch(32, 0, 50)
    assert _jobs(again) == ["pb-0"] and again[0][1][0].redelivered


async def test_one_reclaim_finds_an_entry_abandoned_behind_ten_live_ones(
    aredis: aioredis.Redis,
) -> None:
    """A micro-batch loop claims one entry at a time (XAUTOCLAIM COUNT 1, which scans only 10
    pending entries a call): a dead consumer's entry behind a live worker's long micro-batch
    of 12, kept from going idle, is still found by one reclaim, its abandoning consumer on the
    job's attempt history."""
    partition = abandoned_after(KEYS, VISIBILITY_S)
    store = JobStore(aredis, KEYS, ttl_s=60)
    for job_id in [f"live{i}" for i in range(12)] + ["abandoned"]:
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, partition.online, {"model": "m", "variant": "default"})
    await StreamReader(aredis, KEYS, partition.streams, WORKER).ensure_groups()
    await aredis.xreadgroup(GROUP, "live-1", {partition.online: ">"}, count=12)  # still running
    await _read_by_dead_worker(aredis, partition.online)
    reclaimer = Reclaimer(aredis, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))

    reclaimed = await reclaimer.due(1)
    assert reclaimed is not None and reclaimed[0] == partition.online
    assert _jobs([reclaimed]) == ["abandoned"]
    record = await store.get("abandoned")
    assert record is not None
    history = record.view(history=True)["attempt_history"]
    assert [(run["consumer"], run["outcome"]) for run in history] == [("dead-1", "crashed")]

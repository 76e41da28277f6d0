"""ENQUEUE reads a plain lane's length (XLEN) only where a job needs it: a job whose place is
counted (a deadline's `max_ahead`, a 202's position, a fair lane's hold), or one whose lane's
`max_length` its floor (the lane's counter less its length, at a read the producer was told of)
cannot show unreached. Submit-and-wait calls on a lane far from full read none: one command fewer
per call (benchmark part D, Redis commands per submit-and-wait job). Counted by a real Valkey
itself (INFO commandstats, which counts the commands scripts run); the 429 a full lane answers
checked alike, with other producers' jobs, drained entries and a lost counter.
"""

from __future__ import annotations

import hashlib
import threading

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared import job_scripts
from shared.job_scripts import UNPLACED
from shared.job_store import JobStore, QueueFull, merged_enqueues
from shared.keys import GROUP
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_d_commands_unplaced import _job, _lane_in_use, _script_runs
from tests.test_worker_redis_cost import KEYS, STREAM, _commands


async def test_an_unbounded_call_of_unplaced_jobs_reads_no_length(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    await _lane_in_use(aredis, store)

    before = await _commands(aredis)
    assert await store.create_many([_job(f"item-{n}") for n in range(4)]) == []
    one = await store.create(_job("waited").entry, STREAM, {}, 0, UNPLACED)
    used = await _commands(aredis) - before

    assert one == -1  # not counted
    assert used["xlen"] == 0, used
    assert used["xadd"] == 5, used
    assert await aredis.xlen(STREAM) == 5 + 5


async def test_a_placed_job_after_unplaced_ones_reads_the_length_they_made(
    aredis: aioredis.Redis,
) -> None:
    """The length read late, at the first job that needs it, counts the entries the call's
    unplaced jobs before it added: the 202's job gets its exact position."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await _lane_in_use(aredis, store)  # three undelivered
    calls = [store.enqueue_call(_job(f"waited-{n}"), 0, UNPLACED) for n in range(2)]
    calls += [store.enqueue_call(_job("submitted"), 0)]
    calls += [store.enqueue_call(_job("waited-too"), 0, UNPLACED)]
    calls += [store.enqueue_call(_job("submitted-too"), 0)]
    [((keys, args), _)] = merged_enqueues(calls)

    before = await _commands(aredis)
    replies = await aredis.eval(job_scripts.ENQUEUE, len(keys), *keys, *args)  # type: ignore[misc]
    used = await _commands(aredis) - before

    assert [reply[:2] for reply in replies] == [[1, -1], [1, -1], [1, 5], [1, -1], [1, 7]]
    assert used["xlen"] == 1, used


async def test_a_rerun_of_an_unbounded_unplaced_call_enqueues_nothing_twice(
    aredis: aioredis.Redis,
) -> None:
    """A call sent again (its reply lost) still finds its jobs: no second entry, no length."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await aredis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    calls = [store.enqueue_call(_job(f"job-{n}"), 0, UNPLACED) for n in range(3)]
    [((keys, args), _)] = merged_enqueues(calls)
    first = await aredis.eval(job_scripts.ENQUEUE, len(keys), *keys, *args)  # type: ignore[misc]

    before = await _commands(aredis)
    again = await aredis.eval(job_scripts.ENQUEUE, len(keys), *keys, *args)  # type: ignore[misc]
    used = await _commands(aredis) - before

    assert [reply[2] for reply in again] == [reply[2] for reply in first] == [1, 2, 3]
    assert await aredis.xlen(STREAM) == 3
    assert used["xadd"] == used["xlen"] == 0, used


async def test_a_lane_far_from_full_is_admitted_without_its_length(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    await aredis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)

    before = await _commands(aredis)
    assert await store.create_many([_job("first")], max_length=100) == []  # no floor yet: read
    for n in range(3):
        assert await store.create(_job(f"next-{n}").entry, STREAM, {}, 100, UNPLACED) == -1
    used = await _commands(aredis) - before

    assert used["xlen"] == 1, used
    assert used["xadd"] == 4, used
    assert [await aredis.hget(KEYS.job(f"next-{n}"), "seq") for n in range(3)] == [b"2", b"3", b"4"]


async def _drain(client: aioredis.Redis, count: int) -> None:
    """A worker's read and write-back of `count` entries: acknowledged and deleted (FINISH)."""
    [[_, entries]] = await client.xreadgroup(GROUP, "w", {STREAM: ">"}, count=count)
    ids = [entry_id for entry_id, _ in entries]
    await client.xack(STREAM, GROUP, *ids)
    await client.xdel(STREAM, *ids)


async def test_a_full_lane_refuses_whatever_the_floor(aredis: aioredis.Redis) -> None:
    """Another producer's jobs (its own floor, or an older release's, which reads the length)
    count in the lane's counter: the floor shows the bound until they may have filled it, then
    the length is read, and refuses; drained entries make room again."""
    store, other = JobStore(aredis, KEYS, ttl_s=60), JobStore(aredis, KEYS, ttl_s=60)
    await aredis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    assert await store.create(_job("mine").entry, STREAM, {}, 10, UNPLACED) == -1
    assert await other.create_many([_job(f"other-{n}") for n in range(8)], max_length=10) == []

    before = await _commands(aredis)
    assert await store.create(_job("tenth").entry, STREAM, {}, 10, UNPLACED) == -1
    assert (await _commands(aredis) - before)["xlen"] == 0  # 9 numbers handed out, floor 0
    with pytest.raises(QueueFull) as full:
        await store.create(_job("eleventh").entry, STREAM, {}, 10, UNPLACED)
    assert full.value.length == 10
    assert await aredis.xlen(STREAM) == 10
    assert not await aredis.exists(KEYS.job("eleventh"))

    await _drain(aredis, 3)
    assert await store.create_many([_job(f"room-{n}") for n in range(4)], max_length=10) == [3]
    assert await aredis.xlen(STREAM) == 10


async def test_a_floor_above_a_lost_counter_shows_nothing(aredis: aioredis.Redis) -> None:
    """A lane whose counter and stream were deleted (a flush) numbers from 1 again: a floor
    told before it shows no bound, and the length is read (it admitted the lane past its cap)."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await aredis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    assert await store.create_many([_job(f"old-{n}") for n in range(5)], max_length=100) == []
    await _drain(aredis, 5)
    # placed (a 202's), so read: floor 6 - 1
    assert await store.create(_job("last-old").entry, STREAM, {}, 100) == 0
    await aredis.delete(STREAM, KEYS.added(STREAM))
    await aredis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)

    admitted = [await store.create_many([_job(f"new-{n}")], max_length=3) for n in range(4)]

    assert admitted == [[], [], [], [0]]
    assert await aredis.xlen(STREAM) == 3


async def test_the_producer_hands_a_lanes_floor_from_submit_to_submit(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Through the producer's routes, served in-process over the real Valkey (no worker): the
    first submit-and-wait of a lane reads its length, the next ones are admitted by the floor it
    told (the app's one JobStore keeps it). Each ENQUEUE's own commands, from MONITOR."""
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="r42-floor")
    sha = hashlib.sha1(job_scripts.ENQUEUE.encode()).hexdigest()
    ready, runs = threading.Event(), [[""]]
    watch = threading.Thread(target=_script_runs, args=(redis_url, ready, runs))
    watch.start()
    assert ready.wait(60), "MONITOR did not start"
    async with app_client(create_app(settings)) as producer:
        for _ in range(3):
            path = "/v1/models/identity/predict?timeout=0.01"
            response = await producer.post(path, json={"inputs": {"x": 1}})
            assert response.status_code == 202, response.text
    await aredis.echo("end")
    watch.join(60)
    assert not watch.is_alive(), "MONITOR did not see the end"

    enqueues = [run for run in runs if run[0].startswith(f"EVALSHA {sha}")]
    reads = [[command.split()[0] for command in run[1:]].count("XLEN") for run in enqueues]
    assert reads == [1, 0, 0], enqueues

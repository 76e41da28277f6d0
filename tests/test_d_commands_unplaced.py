"""ENQUEUE reads a plain lane's pending count (XPENDING) only for a job that needs it: one a
deadline admits (`max_ahead`), or whose caller shows its position (a 202's). Submit-and-wait and
a batch's items enqueue UNPLACED, so a call of only those runs one command fewer (benchmark part
D: Redis commands per submit-and-wait job). Counted by a real Valkey itself (INFO commandstats,
which counts the commands scripts run); admission by length and a fair lane's hold, which need
the counts whatever the caller shows, checked alike."""

from __future__ import annotations

import hashlib
import threading

import pytest
import redis
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared import job_scripts
from shared.codec import RequestEntry
from shared.job_scripts import UNPLACED
from shared.job_store import JobStore, NewJob, QueueFull, merged_enqueues, now_ms
from shared.keys import GROUP
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_worker_redis_cost import KEYS, STREAM, _commands


def _job(job_id: str, stream: str = STREAM) -> NewJob:
    entry = RequestEntry(job_id, {"inputs": {"x": job_id}}, now_ms())
    return NewJob(entry, stream, {"model": "m", "variant": "v"})


async def _lane_in_use(client: aioredis.Redis, store: JobStore) -> None:
    """Five jobs enqueued, two of them handed to a worker: three undelivered."""
    await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    assert await store.create_many([_job(f"first-{n}") for n in range(5)]) == []
    await client.xreadgroup(GROUP, "w", {STREAM: ">"}, count=2)


async def test_a_call_of_unplaced_jobs_reads_no_pending_count(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    await _lane_in_use(aredis, store)

    before = await _commands(aredis)
    assert await store.create_many([_job(f"item-{n}") for n in range(4)], max_length=100) == []
    one = await store.create(_job("waited").entry, STREAM, {}, 100, UNPLACED)
    used = await _commands(aredis) - before

    assert one == -1  # not counted
    assert used["xpending"] == 0, used
    assert used["xlen"] == 1, used  # the first call reads it; the floor it told shows the bound


async def test_a_placed_job_is_counted_among_unplaced_ones(aredis: aioredis.Redis) -> None:
    """In one merged call (a group-commit flush of submits of both kinds) the 202's job gets
    its exact position: the undelivered entries, the unplaced jobs before it included."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await _lane_in_use(aredis, store)
    calls = [store.enqueue_call(_job("waited"), 100, UNPLACED)]
    calls += [store.enqueue_call(_job("submitted"), 100)]
    calls += [store.enqueue_call(_job("waited-too"), 100, UNPLACED)]
    [((keys, args), _)] = merged_enqueues(calls)

    before = await _commands(aredis)
    replies = await aredis.eval(job_scripts.ENQUEUE, len(keys), *keys, *args)  # type: ignore[misc]
    used = await _commands(aredis) - before

    assert [reply[:2] for reply in replies] == [[1, -1], [1, 3 + 1], [1, -1]]
    assert used["xpending"] == 1, used


async def test_a_full_lane_still_refuses_an_unplaced_job(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    await _lane_in_use(aredis, store)  # five entries, two in flight: all count
    assert await store.create_many([_job("sixth")], max_length=6) == []
    assert await store.create_many([_job("seventh")], max_length=6) == [0]
    with pytest.raises(QueueFull) as full:
        await store.create(_job("eighth").entry, STREAM, {}, 6, UNPLACED)
    assert full.value.length == 6


async def test_a_fair_lane_still_holds_an_unplaced_job_past_its_window(
    aredis: aioredis.Redis,
) -> None:
    """The hold needs the undelivered count whatever the caller shows."""
    store, stream = JobStore(aredis, KEYS, ttl_s=60), KEYS.queue("fair", "v")
    await aredis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    for n in range(3):
        job = _job(f"f{n}", stream)
        await store.create(job.entry, stream, job.fields, 100, UNPLACED, fair=(2, 1.0))
    assert await aredis.xlen(stream) == 2
    assert await aredis.hget(KEYS.job("f2"), "held") == b"1"


def _script_runs(url: str, ready: threading.Event, runs: list[list[str]]) -> None:
    """Every command the server runs, as MONITOR shows it, grouped by the command from a
    client that ran it (a script's own follow its call, tagged `lua`), until `ECHO end`."""
    with redis.Redis.from_url(url).monitor() as monitor:
        ready.set()
        while (line := monitor.next_command())["command"] != "ECHO end":
            if line["client_type"] == "lua":
                runs[-1].append(line["command"])
            else:
                runs.append([line["command"]])


async def test_submit_and_wait_enqueues_unplaced_and_a_202_placed(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Through the producer's routes, served in-process over the real Valkey (no worker): a
    submit-and-wait's ENQUEUE reads no XPENDING, a submit's (whose 202 shows its position) does."""
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="d-commands")
    sha = hashlib.sha1(job_scripts.ENQUEUE.encode()).hexdigest()
    async with app_client(create_app(settings)) as producer:
        for path, body in [
            ("/v1/models/identity/predict?timeout=0.01", {"inputs": {"x": 1}}),
            ("/v1/jobs", {"model": "identity", "inputs": {"x": 1}}),
        ]:
            ready, runs = threading.Event(), [[""]]
            watch = threading.Thread(target=_script_runs, args=(redis_url, ready, runs))
            watch.start()
            assert ready.wait(60), "MONITOR did not start"
            response = await producer.post(path, json=body)
            await aredis.echo("end")
            watch.join(60)
            assert not watch.is_alive(), "MONITOR did not see the end"
            assert response.status_code == 202, response.text
            [enqueue] = [run for run in runs if run[0].startswith(f"EVALSHA {sha}")]
            read = [command.split()[0] for command in enqueue[1:]]
            assert ("XPENDING" in read) == path.startswith("/v1/jobs"), (path, read)

"""A fair lane's held lists stay bounded on a real Valkey: a job cancelled while held keeps its
entry in its tenant's list (out of the `held` count) until a refill drops it, so a tenant that
submits and cancels while no worker reads has its list swept of them once it holds twice
`max_length` entries; and one refill drops a bounded number of such entries, moving the live
ones behind them in over the refills that follow."""

from __future__ import annotations

import itertools
from pathlib import Path

import redis
import redis.asyncio as aioredis
from starlette.testclient import TestClient

from producer_api.app import create_app
from shared.job_scripts import REFILL_MAX_DROPS
from shared.job_states import JobStatus
from shared.keys import UNCOUNTED_SUFFIX, Keys
from shared.settings import Settings
from tests.test_fair_queuing import KEYS, _config, _job, _lane

MAX_LENGTH = 4


def test_a_tenant_cancelling_its_held_jobs_keeps_its_list_bounded_and_is_not_refused(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Each cancel took its job off the `held` count that admission reads, so with no worker
    reading (no refill dropping the entries) submit + cancel was accepted without end, each
    loop leaving one more entry, payload and all, in the tenant's list. A list at twice
    max_length is swept of its ended jobs' entries instead; refusing there refused the tenant
    for good while its lane was busy (its list all cancelled jobs, `held` 0: no refill ran)."""
    (tmp_path / "fair").mkdir()
    (tmp_path / "fair" / "config.yaml").write_text(
        "kind: batch\nbackend: identity\ninput_schema: {type: object}\n"
        f"queue: {{max_length: {MAX_LENGTH}, fair: true, fair_window: 1}}\n"
    )
    keys = Keys("fh:")
    settings = Settings(
        redis_url=redis_url, key_prefix=keys.prefix, auth="disabled", model_repository=tmp_path
    )
    stream = keys.queue("fair", "default")
    lengths: list[int] = []
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        # the first job joins the stream (its window, never read): every later one is held
        assert client.post("/v1/jobs", json={"model": "fair", "inputs": {}}).status_code == 202
        for n in range(5 * MAX_LENGTH):
            submit = client.post("/v1/jobs", json={"model": "fair", "inputs": {"n": n}})
            assert submit.status_code == 202, (n, submit.text)
            assert client.delete(f"/v1/jobs/{submit.json()['id']}").status_code == 200
            lengths.append(redis_client.llen(keys.held(stream, "default")))
    assert max(lengths) == 2 * MAX_LENGTH and lengths[-1] < 2 * MAX_LENGTH, lengths
    assert redis_client.hget(keys.fair(stream), "held") == b"0"
    assert redis_client.scard(f"{stream}{UNCOUNTED_SUFFIX}") <= 2 * MAX_LENGTH  # swept too


async def test_refills_drop_cancelled_entries_a_bounded_number_at_a_time(
    aredis: aioredis.Redis,
) -> None:
    """One refill dropped every cancelled entry ahead of a live one in the same script (a list
    of a million held the server for seconds); now each drops REFILL_MAX_DROPS at most and,
    having moved nothing, moves in one dropped entry marked `moved`, so that the worker reading
    it (its job cancelled: skipped) takes again and the live jobs still arrive."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    dead = [_job(config, "a") for _ in range(3 * REFILL_MAX_DROPS)]
    live = [_job(config, "a") for _ in range(3)]
    assert await store.create_many(dead + live) == []  # dead[0] in the stream, the rest held
    for job in dead:
        await store.transition(job.entry.job_id, JobStatus.CANCELLED)
    held = KEYS.held(stream, "a")

    first = await reader.take([stream], 4)
    assert first is not None
    assert not any(d.runnable for d in first[1])
    assert any(d.moved for d in first[1])  # a worker that reads it takes again
    assert await aredis.llen(held) == len(dead) - 1 + len(live) - REFILL_MAX_DROPS

    served: list[str] = []
    for _ in range(len(dead) // REFILL_MAX_DROPS + 1):
        taken = await reader.take([stream], 4)
        served += [d.entry.job_id for d in taken[1] if d.runnable and d.entry] if taken else []
    assert served == [job.entry.job_id for job in live]
    assert await aredis.hget(KEYS.fair(stream), "held") == b"0"
    assert not await aredis.exists(held, KEYS.fair_ring(stream))


async def test_a_tenant_near_its_bound_is_swept_once_per_max_length_submits(
    aredis: aioredis.Redis,
) -> None:
    """A sweep at max_length entries left the tenant's live held jobs, up to max_length - 1 of
    them, so the next one came after as few cancel + submit cycles: a tenant holding nearly
    max_length jobs paid a sweep of its whole list every few submits. Swept at twice max_length,
    each sweep drops max_length ended entries at least: one per max_length submits at most."""
    max_length, cycles = 50, 200
    config = _config(window=1)
    store, _, stream = await _lane(aredis, config)
    live = [_job(config, "a") for _ in range(max_length - 4)]  # the first joins the stream
    assert await store.create_many(live, max_length) == []
    held = KEYS.held(stream, "a")
    lengths = [await aredis.llen(held)]
    for n in range(cycles):
        await store.transition(live[1 + n].entry.job_id, JobStatus.CANCELLED)
        live.append(_job(config, "a"))
        assert await store.create_many(live[-1:], max_length) == [], n
        lengths.append(await aredis.llen(held))
    sweeps = sum(after < before for before, after in itertools.pairwise(lengths))
    assert sweeps <= cycles // max_length + 1, lengths
    assert max(lengths) <= 2 * max_length, lengths


async def test_a_refill_wakes_no_worker_with_an_entry_of_a_job_still_queued(
    aredis: aioredis.Redis,
) -> None:
    """A refill that dropped REFILL_MAX_DROPS entries and moved nothing moved the last one it
    dropped in, to wake a blocked worker: an entry of a job moved in already by another (a
    replay held twice) is such a drop, and moved in again, the job was handed out twice."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    first, twice = _job(config, "x"), _job(config, "a")
    assert await store.create_many([first, twice]) == []  # x in the stream, a's job held
    held = KEYS.held(stream, "a")
    packed = await aredis.lindex(held, 0)
    assert packed is not None
    await aredis.rpush(held, *[packed] * REFILL_MAX_DROPS)
    await aredis.hdel(KEYS.job(twice.entry.job_id), "held")  # as if moved in by another entry
    await aredis.hset(KEYS.fair(stream), "held", 2 * REFILL_MAX_DROPS)

    taken = await reader.take([stream], 2)
    assert taken is not None
    assert [d.entry.job_id for d in taken[1] if d.entry] == [first.entry.job_id]
    assert await aredis.llen(held) == 1  # dropped, the next refill's to look at

"""Deadline admission at its edges (issue #17): a deadline exactly at the ETA a 202 would show
was refused as late ("0.0s too late"), since the seconds left were read on the clock after the
job's enqueue stamp, from which its ETA and the refusal's lateness count; a `ttl_s` given beside
a later `deadline` was ignored (the job ran, or was admitted, past it); an ETA past what JSON's
64-bit integers hold (a lane drained at a vanishing `bulk_share`) failed the job's view (500)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from producer_api.app import create_app
from shared.job_store import stamp_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.queue_eta import QueueEta, StartBy
from shared.queue_position import QueuePositions
from shared.settings import Settings
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.app_client import app_client
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
IDLE = KEYS.queue("idle", "default")  # no worker runs it: what waits in it stays
PER_S = 10  # jobs the lane's drained counters say finished each second


async def _measured(client: aioredis.Redis, stream: str, backlog: int) -> None:
    """`stream`'s partition as a worker draining PER_S jobs a second behind `backlog` waiting
    entries leaves it: a serving heartbeat, the drained counters of the seconds around now."""
    with contextlib.suppress(ResponseError):  # a producer made it as it started
        await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    for index in range(backlog):
        await client.xadd(stream, {"n": index})
    second = int(time.time())
    for at in range(second - 10, second + 30):
        await client.set(KEYS.drained(stream, at), PER_S)
    beat = Heartbeat("w-1", "host", 1, "serving", models=["idle:default"])
    await WorkerRegistry(client, KEYS).publish(beat)


def _queue_eta(client: aioredis.Redis) -> QueueEta:
    return QueueEta(client, QueuePositions(client, KEYS), ModelRepository.load(FIXTURES))


async def test_a_deadline_exactly_at_the_eta_is_admitted(aredis: aioredis.Redis) -> None:
    """Whatever the rate, a job is admitted when the ETA it would be shown falls on its
    deadline, and refused when it falls a millisecond after; its enqueue stamp a little in the
    past, as a request's is by the time it reaches ENQUEUE."""
    eta = _queue_eta(aredis)
    config = eta.repository.models["idle"]
    await _measured(aredis, IDLE, 40)
    await eta.refresh()
    assert eta.lane_rate(config, "default", bulk=False) > 0
    enqueued = stamp_ms() - 20
    for ahead in range(1, 40):
        eta_ms = eta.standing(config, "default", False, ahead).eta_ms
        assert eta_ms is not None
        on_time = StartBy.of(config, enqueued, int(enqueued) + eta_ms)
        assert eta.max_ahead(config, "default", False, on_time) >= ahead, (ahead, eta_ms)
        late = StartBy.of(config, enqueued, int(enqueued) + eta_ms - 1)
        assert eta.max_ahead(config, "default", False, late) < ahead, (ahead, eta_ms)


async def test_an_eta_past_64_bits_is_unknown(aredis: aioredis.Redis) -> None:
    """A bulk lane with a vanishing share behind online work: its ETA is unknown (null), not
    an integer JSON cannot carry (orjson refused it: every view of the job answered 500) or an
    infinite float (`round` raised)."""
    eta = _queue_eta(aredis)
    await _measured(aredis, IDLE, 5)
    await eta.refresh()
    config = eta.repository.models["idle"]
    for share in (1e-20, 1e-320):
        tiny = config.model_copy(update={"bulk_share": share})
        assert eta.standing(tiny, "default", bulk=True, position=3).eta_ms is None
    assert eta.standing(config, "default", bulk=True, position=3).eta_ms is not None


@pytest.fixture
async def api(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """A producer in this process on the real server, serving the queue fixtures."""
    settings = Settings(
        redis_url=redis_url,
        key_prefix=KEYS.prefix,
        auth="disabled",
        model_repository=str(FIXTURES),
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def _job_deadline(client: aioredis.Redis, job_id: str) -> int:
    return int(await client.hget(KEYS.job(job_id), "deadline") or 0)


async def test_a_job_without_a_deadline_names_none_in_its_hash(
    api: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """Its hash leaves `deadline` out, as its stream entry does: a `deadline: 0` cost Valkey a
    field per job (tests/test_job_hash_fields.py has the other job writers)."""
    response = await api.post("/v1/jobs", json={"model": "idle", "inputs": {}})
    assert response.status_code == 202, response.text
    job = await aredis.hgetall(KEYS.job(response.json()["id"]))
    assert job[b"status"] == b"queued" and b"deadline" not in job, job


async def test_a_ttl_sooner_than_the_deadline_bounds_the_job(
    api: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """Both given: the sooner limit is the job's (the `ttl_s` was dropped for the `deadline`)."""
    body = {"model": "idle", "inputs": {}, "deadline": time.time() + 3600, "ttl_s": 5}
    before = time.time()
    response = await api.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    deadline = await _job_deadline(aredis, response.json()["id"])
    # whole ms, cut from a clock read at or after `before`: within the same ms it reads below
    # `before`'s fraction
    assert int(before * 1000) + 5000 <= deadline <= time.time() * 1000 + 5000
    body = {"model": "idle", "inputs": {}, "deadline": time.time() + 60, "ttl_s": 3600}
    response = await api.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    assert await _job_deadline(aredis, response.json()["id"]) == int(body["deadline"] * 1000)


async def test_a_binding_ttl_beside_a_later_deadline_is_refused_with_retry_after(
    api: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """100 jobs ahead at 10/s: a `ttl_s` of 1 cannot be met, though the `deadline` beside it
    could; refused as a `ttl_s` alone is, with the Retry-After its retry can use."""
    await _measured(aredis, IDLE, 100)
    body = {"model": "idle", "inputs": {}, "deadline": time.time() + 3600}
    for _ in range(50):  # the producer's refresh, once a second, reads the rate
        probe = await api.post("/v1/jobs", json={"model": "idle", "inputs": {}, "ttl_s": 1})
        if probe.status_code == 429:
            break
        await asyncio.sleep(0.1)
    assert probe.status_code == 429, probe.text
    response = await api.post("/v1/jobs", json={**body, "ttl_s": 1})
    assert response.status_code == 429, response.text
    assert response.json()["error"]["type"] == "deadline_unmeetable"
    retry_after = int(response.headers["Retry-After"])
    assert retry_after in range(1, 61), retry_after
    assert response.json()["error"]["eta_ms"] > 1000
    response = await api.post("/v1/jobs", json=body)  # the deadline alone is met
    assert response.status_code == 202, response.text

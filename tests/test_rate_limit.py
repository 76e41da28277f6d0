"""Per-key quotas are exact across producer replicas: two real producer processes share one
Redis, parallel requests race for the same bucket or in-flight slots, and exactly the limit
gets through; the rest get 429 with Retry-After and RateLimit-* headers. A slot whose release was
lost is pruned once the set reaches its cap."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from conveyor.stack import Stack, free_port
from shared.job_store import now_ms
from shared.keys import Keys
from shared.rate_limit import InFlightLimiter, Quota, RateLimiter
from tests.conftest import issue_key

pytestmark = pytest.mark.slow
JOB = {"model": "identity", "inputs": {"x": 1}}
RAN = {**JOB, "variant": "canary"}  # the only partition a worker serves here
UNLIMITED = {"rate_per_s": 10_000.0, "burst": 10_000, "max_in_flight": 10_000}


@pytest.fixture(scope="module")
def producers(auth_stack: Stack) -> Iterator[list[str]]:
    """The auth stack's producer and a second replica on the same Redis."""
    second = auth_stack.start_producer(free_port(), name="producer-2")
    try:
        yield [auth_stack.base_url, second]
    finally:
        auth_stack.stop_process("producer-2")


@pytest.fixture(scope="module")
def canary_worker(auth_stack: Stack) -> Iterator[int]:
    pid = auth_stack.start_worker("identity:canary", name="rate-limit-canary")
    try:
        yield pid
    finally:
        auth_stack.stop_process("rate-limit-canary")


async def _burst(
    urls: list[str], key: str, n: int, body: dict[str, Any] = JOB
) -> list[httpx.Response]:
    """`n` submits at once, alternating between the producers."""
    async with httpx.AsyncClient(timeout=60, headers={"X-API-Key": key}) as client:
        sends = [
            client.post(f"{url}/v1/jobs", json=body)
            for url, _ in zip(itertools.cycle(urls), range(n), strict=False)
        ]
        return list(await asyncio.gather(*sends))


def _statuses(responses: list[httpx.Response]) -> Counter[int]:
    return Counter(r.status_code for r in responses)


def test_token_bucket_admits_exactly_the_burst_across_two_producers(
    auth_stack: Stack, producers: list[str]
) -> None:
    # One token per 1000 s: nothing refills during the test, so the burst is the whole window.
    key = issue_key(
        auth_stack.redis_url, "acme", "submit", rate_per_s=0.001, burst=20, max_in_flight=1000
    )
    responses = asyncio.run(_burst(producers, key, 120))
    assert _statuses(responses) == {202: 20, 429: 100}
    refused = [r for r in responses if r.status_code == 429]
    assert {r.json()["error"]["type"] for r in refused} == {"rate_limited"}
    assert {r.headers["RateLimit-Limit"] for r in refused} == {"20"}
    assert {r.headers["RateLimit-Remaining"] for r in refused} == {"0"}
    assert all(int(r.headers["Retry-After"]) >= 999 for r in refused)
    # every answer tells the key where it stands, not only its refusals: each take left one less
    accepted = [r for r in responses if r.status_code == 202]
    assert {r.headers["RateLimit-Limit"] for r in accepted} == {"20"}
    assert sorted(int(r.headers["RateLimit-Remaining"]) for r in accepted) == list(range(20))
    assert not any("Retry-After" in r.headers for r in accepted)


def test_token_bucket_refills_at_its_rate(auth_stack: Stack, producers: list[str]) -> None:
    key = issue_key(auth_stack.redis_url, "acme", "submit", rate_per_s=1.0, burst=1)
    assert _statuses(asyncio.run(_burst(producers, key, 4))) == {202: 1, 429: 3}
    time.sleep(1.2)  # one token back (the bucket holds at most one)
    assert _statuses(asyncio.run(_burst(producers, key, 4))) == {202: 1, 429: 3}


def test_a_batch_create_takes_one_token(auth_stack: Stack) -> None:
    """Creating a batch took two tokens (one per service its route took), so a key with a
    burst of one was refused 429 on every create."""
    key = issue_key(auth_stack.redis_url, "acme", "submit", rate_per_s=0.001, burst=1)

    def create() -> httpx.Response:
        return httpx.post(
            f"{auth_stack.base_url}/v1/batches",
            params={"model": "identity", "completion_window": "1h"},
            content=b'{"custom_id": "a", "body": {"inputs": {"x": 1}}}\n',
            headers={"X-API-Key": key, "Content-Type": "application/jsonl"},
            timeout=60,
        )

    assert create().status_code == 202
    assert create().status_code == 429  # the one token is spent


def test_in_flight_cap_is_exact_across_two_producers(
    auth_stack: Stack, producers: list[str]
) -> None:
    limits = {**UNLIMITED, "max_in_flight": 7}
    key = issue_key(auth_stack.redis_url, "acme", "submit", "read", **limits)
    responses = asyncio.run(_burst(producers, key, 60))  # no worker serves identity:default
    assert _statuses(responses) == {202: 7, 429: 53}
    refused = {r.json()["error"]["type"] for r in responses if r.status_code == 429}
    assert refused == {"too_many_in_flight"}
    first = next(r for r in responses if r.status_code == 202).json()["id"]
    cancelled = httpx.delete(f"{producers[1]}/v1/jobs/{first}", headers={"X-API-Key": key})
    assert cancelled.status_code == 200
    assert _statuses(asyncio.run(_burst(producers, key, 5))) == {202: 1, 429: 4}


def test_jobs_that_end_on_a_worker_free_their_slots(
    auth_stack: Stack, producers: list[str], canary_worker: int
) -> None:
    limits = {**UNLIMITED, "max_in_flight": 4}
    key = issue_key(auth_stack.redis_url, "acme", "submit", "read", **limits)
    for _ in range(5):  # rounds after the first fit only if finished jobs gave slots back
        responses = asyncio.run(_burst(producers, key, 4, RAN))
        assert _statuses(responses) == {202: 4}
        for response in responses:
            job = httpx.get(
                response.json()["urls"]["self"],
                params={"wait": 30},
                headers={"X-API-Key": key},
                timeout=60,
            )
            assert job.json()["status"] == "succeeded"


async def test_slots_whose_release_was_lost_are_pruned_at_the_cap(aredis: aioredis.Redis) -> None:
    """At the cap, members whose jobs ended (their ZREM lost) or whose submit died (no hash past
    the grace period) give their slots up; queued jobs, and a submit still being written, keep
    theirs."""
    keys = Keys("rl:")
    limiter = InFlightLimiter(aredis, keys, ttl_s=60)
    slots = keys.in_flight("k1")
    for job_id in ("ended", "queued"):
        assert await limiter.admit("k1", job_id, cap=3)
    await aredis.zadd(slots, {"died": now_ms() - InFlightLimiter.GRACE_MS - 1_000})
    await aredis.hset(keys.job("ended"), "status", "succeeded")
    await aredis.hset(keys.job("queued"), "status", "queued")

    assert await limiter.admit("k1", "fresh", cap=3)  # "ended" and "died" pruned
    assert await limiter.admit("k1", "writing", cap=3)
    # nothing to prune: "fresh" and "writing" have no hash yet, but are within the grace
    assert not await limiter.admit("k1", "refused", cap=3)
    assert set(await aredis.zrange(slots, 0, -1)) == {b"queued", b"fresh", b"writing"}


async def test_an_admission_rerun_after_its_reply_was_lost_is_admitted(
    aredis: aioredis.Redis,
) -> None:
    """At one below the cap, the first run took the last slot; its rerun (redis-py resends
    through a dropped connection) was refused at the cap it had filled itself: a false 429,
    and a slot held by a job that never existed."""
    limiter = InFlightLimiter(aredis, Keys("rl-rerun:"), ttl_s=60)
    assert await limiter.admit("k1", "j1", cap=1)
    assert await limiter.admit("k1", "j1", cap=1)  # the rerun
    assert not await limiter.admit("k1", "j2", cap=1)


async def test_a_bucket_rerun_after_its_reply_was_lost_is_not_charged_again(
    aredis: aioredis.Redis,
) -> None:
    """The rerun of a take (redis-py resends through a dropped connection) took a second
    token: a key at its burst got a false 429. A rerun keeps its first verdict, refused too,
    even once a token came back, and charges nothing."""
    keys = Keys("rl-rerun-bucket:")
    limiter = RateLimiter(aredis, keys)
    quota = Quota(rate_per_s=0.001, burst=1, max_in_flight=1, max_streams=1)
    assert (await limiter.take("k1", quota, request_id="r1")).allowed
    assert (await limiter.take("k1", quota, request_id="r1")).allowed  # the rerun
    assert not (await limiter.take("k1", quota, request_id="r2")).allowed
    await aredis.hset(keys.rate_bucket("k1"), "tokens", 1)  # a token came back meanwhile
    assert not (await limiter.take("k1", quota, request_id="r2")).allowed  # the rerun
    assert (await limiter.take("k1", quota, request_id="r3")).allowed  # the token is still there

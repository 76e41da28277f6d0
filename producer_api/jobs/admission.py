"""Admission for new jobs: idempotency keys (a retried submit returns the original job) and
backpressure (a full partition answers 429 with a Retry-After from its recent drain rate)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from producer_api.errors import ConveyorError
from shared.codec import as_text, dumps
from shared.drain_rate import drain_rates
from shared.keys import Keys
from shared.redis_client import call_script

log = logging.getLogger(__name__)

DRAIN_WINDOW_S = 10
# How long a repeated submit waits for the first one with its key to be enqueued (or to give the
# key up), and how often it looks: enqueuing takes milliseconds.
IN_PROGRESS_WAIT_S = 5.0
IN_PROGRESS_POLL_S = 0.05
# Give a key up only if this submit's claim still holds it: another's (a retry that claimed it
# after this one's expired) stays.
RELEASE_OWN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def fingerprint(body: dict[str, object]) -> str:
    canonical = dumps(body)
    return hashlib.sha256(canonical).hexdigest()


class IdempotencyKeys:
    """`cv:idem:{tenant}:{sha256(key)}` → `{job_id}:{body fingerprint}`, SET NX with the result
    TTL; hashing the header keeps client text out of key names."""

    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._release = client.register_script(RELEASE_OWN)

    def _key(self, tenant: str, key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:40]
        return self.keys.idempotency(tenant, digest)

    async def claim(
        self,
        tenant: str,
        key: str,
        job_id: str,
        body_fingerprint: str,
        enqueued: Callable[[str], Awaitable[bool]],
    ) -> str | None:
        """None if this submit owns the key now; else the id of the job it was first used for,
        once `enqueued` says that job is. A client's retry can arrive while its first try is still
        being enqueued (the client timed out): answering with the job id then would hand over an
        id that never exists should the first try fail (a full queue). So the retry waits for
        the job, or for the first try to give the key up, and then enqueues its own."""
        deadline = time.monotonic() + IN_PROGRESS_WAIT_S
        while (first := await self._claim(tenant, key, job_id, body_fingerprint)) is not None:
            if await enqueued(first):
                return first
            if time.monotonic() >= deadline:
                raise ConveyorError(
                    409,
                    "conflict",
                    "the first request with this Idempotency-Key is still being enqueued; retry",
                    {"Retry-After": "1"},
                )
            await asyncio.sleep(IN_PROGRESS_POLL_S)
        return None

    async def _claim(self, tenant: str, key: str, job_id: str, body_fingerprint: str) -> str | None:
        """None if this submit owns the key now; else the job id it was first used for."""
        redis_key = self._key(tenant, key)
        value = _claim_value(job_id, body_fingerprint)
        if await self.redis.set(redis_key, value, nx=True, ex=self.ttl_s):
            return None
        existing = await self.redis.get(redis_key)
        if existing is None:  # expired between the two calls: take it now
            return await self._claim(tenant, key, job_id, body_fingerprint)
        first_job, first_fingerprint = _claimed(existing)
        if first_fingerprint != body_fingerprint:
            raise ConveyorError(
                409, "conflict", "Idempotency-Key was already used with a different body"
            )
        return first_job

    async def used_for(
        self,
        tenant: str,
        key: str,
        body_fingerprint: str,
        enqueued: Callable[[str], Awaitable[bool]],
    ) -> str | None:
        """The job a request with this key and body was accepted as, if one was (read only:
        for a retry that would be refused now)."""
        existing = await self.redis.get(self._key(tenant, key))
        if existing is None:
            return None
        first_job, first_fingerprint = _claimed(existing)
        if first_fingerprint != body_fingerprint or not await enqueued(first_job):
            return None
        return first_job

    async def release(self, tenant: str, key: str, job_id: str, body_fingerprint: str) -> None:
        """Free the key when the submit that claimed it as `job_id` did not enqueue anything
        (a claim that failed may have been written all the same). Best effort: a key that
        cannot be given back now expires with the results."""
        keys, value = [self._key(tenant, key)], [_claim_value(job_id, body_fingerprint)]
        try:
            await call_script(self._release, keys, value)
        except RedisError as exc:
            log.warning("could not give back an idempotency key: %r", exc)


def _claim_value(job_id: str, body_fingerprint: str) -> str:
    return f"{job_id}:{body_fingerprint}"


def _claimed(value: bytes | str) -> tuple[str, str]:
    """A claim's first job id and body fingerprint."""
    first_job, _, first_fingerprint = as_text(value).partition(":")
    return first_job, first_fingerprint


class Backpressure:
    """What a full partition answers, from the per-second drain counters workers keep."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    async def queue_full(self, stream: str, length: int) -> ConveyorError:
        """429 whose Retry-After is how long the partition needs, at its drain rate over the
        last few seconds, to make room (1 s at least, 60 s at most)."""
        (rate,) = await drain_rates(self.redis, self.keys, [stream], DRAIN_WINDOW_S)
        wait = 60 if rate == 0 else min(60, max(1, math.ceil(1 / rate)))
        return ConveyorError(
            429,
            "queue_full",
            f"{stream} is full ({length} queued or in flight); retry in {wait}s",
            {"Retry-After": str(wait)},
        )

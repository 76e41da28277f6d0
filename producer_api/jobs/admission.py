"""Admission for new jobs: idempotency keys (a retried submit returns the original job) and
backpressure (a full partition answers 429 with a Retry-After from its recent drain rate)."""

from __future__ import annotations

import hashlib
import math
import time

from producer_api.errors import ConveyorError
from producer_api.state import ProducerState
from shared.codec import dumps

DRAIN_WINDOW_S = 10


def fingerprint(body: dict[str, object]) -> str:
    canonical = dumps(body)
    return hashlib.sha256(canonical).hexdigest()


class IdempotencyKeys:
    """`cv:idem:{tenant}:{sha256(key)}` → `{job_id}:{body fingerprint}`, SET NX with the result
    TTL; hashing the header keeps client text out of key names."""

    def __init__(self, state: ProducerState) -> None:
        self.state = state

    def _key(self, tenant: str, key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:40]
        return self.state.keys.idempotency(tenant, digest)

    async def claim(self, tenant: str, key: str, job_id: str, body_fingerprint: str) -> str | None:
        """None if this submit owns the key now; else the job id it was first used for."""
        redis_key = self._key(tenant, key)
        value = f"{job_id}:{body_fingerprint}"
        ttl = self.state.settings.result_ttl_s
        if await self.state.redis.set(redis_key, value, nx=True, ex=ttl):
            return None
        existing = await self.state.redis.get(redis_key)
        if existing is None:  # expired between the two calls: take it now
            return await self.claim(tenant, key, job_id, body_fingerprint)
        text = existing.decode() if isinstance(existing, bytes) else str(existing)
        first_job, _, first_fingerprint = text.partition(":")
        if first_fingerprint != body_fingerprint:
            raise ConveyorError(
                409, "conflict", "Idempotency-Key was already used with a different body"
            )
        return first_job

    async def release(self, tenant: str, key: str) -> None:
        """Free the key when the submit that claimed it did not enqueue anything."""
        await self.state.redis.delete(self._key(tenant, key))


async def queue_full_error(state: ProducerState, stream: str, length: int) -> ConveyorError:
    """429 whose Retry-After is how long the partition needs, at its drain rate over the last
    few seconds, to make room (1 s at least, 60 s at most)."""
    now = int(time.time())
    keys = [state.keys.drained(stream, now - back) for back in range(1, DRAIN_WINDOW_S + 1)]
    drained = sum(int(count) for count in await state.redis.mget(keys) if count)
    rate = drained / DRAIN_WINDOW_S
    wait = 60 if rate == 0 else min(60, max(1, math.ceil(1 / rate)))
    return ConveyorError(
        429,
        "queue_full",
        f"{stream} is full ({length} queued or in flight); retry in {wait}s",
        {"Retry-After": str(wait)},
    )

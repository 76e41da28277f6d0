"""An Idempotency-Key's claim lives as long as the record of the job it names may, on a real
Valkey: it lived one result TTL from the submit while a job that ended later (here a cancel, as
a worker's result would) keeps its record a result TTL from its end, so a retry in between made
a second job that ran the same work while the first one still lived. Once the job's record is
gone, the key is free again, whatever the body (the longer claim no longer names anything)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from producer_api.jobs import admission
from producer_api.jobs.admission import BodyPrint, IdempotencyKeys
from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from tests.conftest import until_async

KEYS = Keys("idem-r27:")
TENANT, KEY, BODY = "acme", "order-27", BodyPrint("fingerprint")
TTL_S = 2  # the result TTL
# When the job ends, after its claim: the record then outlives a result TTL from the claim by
# this much, the window in which a retry must still find the job (a stall shorter than it
# between the two reads below cannot lose the record).
ENDED_AT_S = 1.3


async def _sleep_until(start: float, offset: float) -> None:
    await asyncio.sleep(max(0.0, start + offset - time.monotonic()))


async def test_a_retry_finds_the_job_while_its_record_lives_and_the_key_frees_after(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, store = IdempotencyKeys(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    first = new_job_id("m", "default")
    assert await keys.claim(TENANT, KEY, first, BODY, store.exists) is None
    start = time.monotonic()  # after the claim: one living a result TTL is gone by TTL_S
    entry = RequestEntry(first, {"inputs": {}}, now_ms())
    await store.create(entry, KEYS.queue("m", "default"), {"model": "m", "variant": "default"})
    await _sleep_until(start, ENDED_AT_S)
    await store.transition(first, JobStatus.CANCELLED)  # ended: its record lives TTL_S on
    await _sleep_until(start, TTL_S + 0.2)  # past a result TTL from the submit
    assert await store.exists(first)
    retry = new_job_id("m", "default")
    assert await keys.claim(TENANT, KEY, retry, BODY, store.exists) == first

    async def record_gone() -> bool:
        return not await store.exists(first)

    # the record lapses TTL_S after the end, the claim not: waited for, not slept to (an end
    # that came late on a loaded machine kept the record past a fixed time)
    await until_async(record_gone, timeout=10 * TTL_S, every=0.02)
    monkeypatch.setattr(admission, "ABANDONED_AFTER_S", 0.1)
    other = BodyPrint("another body")
    assert await keys.claim(TENANT, KEY, retry, other, store.exists) is None  # not a 409

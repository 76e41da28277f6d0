"""The job state machine, checked against a real server: legal moves pass, illegal ones are
refused atomically, terminal states never change, hashes expire."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import TERMINAL, IllegalTransition, JobStatus, allowed
from shared.job_store import JobNotFound, JobStore, now_ms
from shared.keys import Keys

KEYS = Keys("t:")


async def _queued(aredis: aioredis.Redis, job_id: str) -> JobStore:
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry(job_id=job_id, payload={"inputs": {}}, enqueued_ms=now_ms())
    await store.create(entry, KEYS.queue("m", "v"), {"model": "m", "variant": "v"})
    return store


def test_terminal_states_allow_nothing() -> None:
    for state in TERMINAL:
        assert not any(allowed(state, target) for target in JobStatus)
    assert allowed("queued", "running") and allowed("running", "succeeded")
    assert not allowed("queued", "succeeded") and not allowed(None, "running")


async def test_create_writes_hash_and_entry_together(aredis: aioredis.Redis) -> None:
    store = await _queued(aredis, "a1")
    record = await store.get("a1")
    assert record is not None and record.status is JobStatus.QUEUED
    entries = await aredis.xrange(KEYS.queue("m", "v"))
    assert [fields[b"id"] for _, fields in entries] == [b"a1"]
    assert 0 < await aredis.ttl(KEYS.job("a1")) <= 60


async def test_a_retried_create_enqueues_nothing_twice(aredis: aioredis.Redis) -> None:
    """A create retried after its reply was lost (a torn connection) finds the job's hash:
    no second entry, and a job that ended meanwhile is not queued again."""
    store = await _queued(aredis, "a5")
    await store.transition("a5", JobStatus.CANCELLED)
    entry = RequestEntry(job_id="a5", payload={"inputs": {}}, enqueued_ms=now_ms())
    await store.create(entry, KEYS.queue("m", "v"), {"model": "m", "variant": "v"})
    assert await aredis.xlen(KEYS.queue("m", "v")) == 1
    assert await aredis.hget(KEYS.job("a5"), "status") == b"cancelled"


async def test_transition_refuses_leaving_a_terminal_state(aredis: aioredis.Redis) -> None:
    store = await _queued(aredis, "a2")
    cancelled = await store.transition("a2", JobStatus.CANCELLED)
    assert cancelled.status is JobStatus.CANCELLED and "finished" in cancelled.fields
    with pytest.raises(IllegalTransition) as info:
        await store.transition("a2", JobStatus.RUNNING)
    assert info.value.current == "cancelled"
    record = await store.get("a2")
    assert record is not None and record.status is JobStatus.CANCELLED


async def test_transition_of_unknown_job(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    with pytest.raises(JobNotFound):
        await store.transition("nope", JobStatus.CANCELLED)


async def test_transition_publishes_the_view(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry("a3", {"inputs": {}}, now_ms(), reply="t:reply:p1")
    await store.create(entry, KEYS.queue("m", "v"), {"model": "m", "variant": "v"})
    pubsub = aredis.pubsub(ignore_subscribe_messages=True)
    await pubsub.ssubscribe("t:reply:p1")
    await store.transition("a3", JobStatus.CANCELLED)
    message = None
    for _ in range(50):
        message = await pubsub.get_message(timeout=0.1)
        if message:
            break
    await pubsub.aclose()
    assert message is not None and b'"status":"cancelled"' in message["data"]

"""A client's retry that arrives while its first try is still being enqueued (the client timed out
and the SDK sent the same Idempotency-Key again), on a real Valkey, no stack: the retry answers
with the first job only once that job exists; if the first try gives the key up (its enqueue
failed), the retry enqueues its own job instead of naming one that never existed."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from producer_api.errors import ConveyorError
from producer_api.jobs import admission
from producer_api.jobs.admission import IdempotencyKeys
from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id

KEYS = Keys("idem:")
TENANT, KEY, BODY = "acme", "order-42", "fingerprint"


def _stores(client: aioredis.Redis) -> tuple[IdempotencyKeys, JobStore]:
    return IdempotencyKeys(client, KEYS, 60), JobStore(client, KEYS, 60)


async def _retry(
    keys: IdempotencyKeys, store: JobStore
) -> tuple[str, str, asyncio.Task[str | None]]:
    """The first try's job id, holding the key (not yet enqueued), the retry's, and the retry
    waiting on it."""
    first, retry = new_job_id("m", "default"), new_job_id("m", "default")
    assert await keys.claim(TENANT, KEY, first, BODY, store.exists) is None
    waiting = asyncio.create_task(keys.claim(TENANT, KEY, retry, BODY, store.exists))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # no job yet: the retry names none
    return first, retry, waiting


async def _enqueue(store: JobStore, job_id: str) -> None:
    entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
    await store.create(entry, KEYS.queue("m", "default"), {"model": "m", "variant": "default"})


async def test_a_retry_answers_with_the_first_job_once_it_is_enqueued(
    aredis: aioredis.Redis,
) -> None:
    keys, store = _stores(aredis)
    first, _, waiting = await _retry(keys, store)
    await _enqueue(store, first)
    assert await asyncio.wait_for(waiting, 10) == first


async def test_a_retry_enqueues_its_own_job_when_the_first_try_gives_the_key_up(
    aredis: aioredis.Redis,
) -> None:
    keys, store = _stores(aredis)
    _, retry, waiting = await _retry(keys, store)
    await keys.release(TENANT, KEY)  # the first try's enqueue failed (a full queue, say)
    assert await asyncio.wait_for(waiting, 10) is None  # the retry holds the key now
    await _enqueue(store, retry)
    third = new_job_id("m", "default")
    assert await keys.claim(TENANT, KEY, third, BODY, store.exists) == retry
    with pytest.raises(ConveyorError) as conflict:
        await keys.claim(TENANT, KEY, third, "another body", store.exists)
    assert conflict.value.status == 409 and "different body" in conflict.value.message


async def test_a_first_try_that_never_ends_leaves_the_retry_a_409_to_try_later(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "IN_PROGRESS_WAIT_S", 0.3)
    keys, store = _stores(aredis)
    first = new_job_id("m", "default")
    assert await keys.claim(TENANT, KEY, first, BODY, store.exists) is None
    with pytest.raises(ConveyorError) as busy:
        await keys.claim(TENANT, KEY, new_job_id("m", "default"), BODY, store.exists)
    assert busy.value.status == 409 and busy.value.headers == {"Retry-After": "1"}
    assert "still being enqueued" in busy.value.message

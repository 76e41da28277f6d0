"""A client's retry that arrives while its first try is still being enqueued (the client timed out
and the SDK sent the same Idempotency-Key again), on a real Valkey, no stack: the retry answers
with the first job only once that job exists; if the first try gives the key up (its enqueue
failed), the retry enqueues its own job instead of naming one that never existed. A job whose
enqueue failed after it was written keeps its key and its in-flight slot."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from producer_api.app import create_app
from producer_api.errors import ConveyorError
from producer_api.jobs import admission
from producer_api.jobs.admission import BodyPrint, IdempotencyKeys
from producer_api.jobs.protocol import PredictRequest
from shared.api_keys import ApiKeyStore, KeySpec
from shared.codec import RequestEntry, dumps
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from shared.settings import Settings, get_settings

KEYS = Keys("idem:")
TENANT, KEY, BODY = "acme", "order-42", BodyPrint("fingerprint")


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
    first, retry, waiting = await _retry(keys, store)
    await keys.release(TENANT, KEY, first)  # the first try's enqueue failed (queue full)
    assert await asyncio.wait_for(waiting, 10) is None  # the retry holds the key now
    await _enqueue(store, retry)
    third = new_job_id("m", "default")
    assert await keys.claim(TENANT, KEY, third, BODY, store.exists) == retry
    with pytest.raises(ConveyorError) as conflict:
        await keys.claim(TENANT, KEY, third, BodyPrint("another body"), store.exists)
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


async def test_a_claim_whose_job_never_appeared_is_taken_over_once_abandoned(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit that failed with Redis gone could not give its key back: every retry waited
    for a job that never existed and got 409, until the key expired a day later. Past
    ABANDONED_AFTER_S the retry takes the claim over (only that claim: a retry's own, made
    meanwhile, stays), and one written before claims carried their time counts as abandoned."""
    keys, store = _stores(aredis)
    monkeypatch.setattr(admission, "IN_PROGRESS_WAIT_S", 0.3)
    lost, retry = new_job_id("m", "default"), new_job_id("m", "default")
    assert await keys.claim(TENANT, KEY, lost, BODY, store.exists) is None
    with pytest.raises(ConveyorError):  # young (ABANDONED_AFTER_S: 60): maybe being enqueued
        await keys.claim(TENANT, KEY, retry, BODY, store.exists)
    # the claim is older now than that: the retry waited IN_PROGRESS_WAIT_S for it
    monkeypatch.setattr(admission, "ABANDONED_AFTER_S", 0.1)
    assert await keys.claim(TENANT, KEY, retry, BODY, store.exists) is None  # taken over
    await _enqueue(store, retry)
    assert await keys.claim(TENANT, KEY, new_job_id("m", "default"), BODY, store.exists) == retry

    older = "older-key"  # a claim as written before claims carried their time
    await aredis.set(keys._key(TENANT, older), f"{lost}:{BODY.value}")  # the key's own name
    assert await keys.claim(TENANT, older, retry, BODY, store.exists) is None


@pytest.mark.parametrize("check_fails", [False, True])
async def test_a_job_written_before_its_enqueue_failed_keeps_its_key_and_slot(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, check_fails: bool
) -> None:
    """An enqueue can fail after ENQUEUE ran: replicas that did not confirm the job, a reply
    lost with its connection (a 503 either way). The key and the in-flight slot were given back
    all the same, so the client's retry with the key enqueued the job a second time, beside a
    job holding no slot. So they were when the look for the job failed too (`check_fails`; it
    shared a flush whose replica WAIT fell short): what cannot be told enqueued may be, and the
    claim and slot of a job that never appears are taken over and pruned later. The producer
    runs in-process, ENQUEUE on a real Valkey."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    spec = KeySpec(tenant=tenant, scopes=frozenset({"submit", "read"}), max_in_flight=1)
    api_key, _ = await ApiKeyStore(aredis, Keys()).create(spec)
    app = create_app(Settings(redis_url=redis_url, instance_id="ambiguous"))
    url, body = "/v1/jobs", {"model": "identity", "inputs": {"x": tenant}}
    auth = {"Authorization": f"Bearer {api_key}"}
    headers = {**auth, "Idempotency-Key": "order-7"}
    async with app.router.lifespan_context(app):
        store = app.state.conveyor.job_store
        written = store.create

        async def written_then_lost(*args: Any, **kwargs: Any) -> int:
            await written(*args, **kwargs)
            raise RedisConnectionError("the reply was lost with its connection")

        async def unreadable(job_id: str) -> bool:
            raise RedisConnectionError("the look for the job failed too")

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            monkeypatch.setattr(store, "create", written_then_lost)
            if check_fails:
                monkeypatch.setattr(store, "exists", unreadable)
            first = await client.post(url, json=body, headers=headers)
            assert first.status_code == 503, first.text
            monkeypatch.undo()
            again = await client.post(url, json=body, headers=headers)
            other = await client.post(url, json={**body, "inputs": {"x": 2}}, headers=auth)
    assert again.status_code == 200 and again.json()["status"] == "queued", again.text
    assert other.status_code == 429, other.text  # the queued job still holds the one slot
    assert other.json()["error"]["type"] == "too_many_in_flight"
    entries = await aredis.xrange(Keys().queue("identity", "default"))
    assert [f[b"id"].decode() for _, f in entries].count(again.json()["id"]) == 1
    assert sum(b"tenant" in f and f[b"tenant"].decode() == tenant for _, f in entries) == 1


async def test_a_claim_its_replicas_did_not_confirm_is_given_back(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `CONVEYOR_REPLICA_ACKS` and no replica to confirm anything, the claim of a key is
    written and its submit answers 503. The claim stayed: every retry with the key waited 5 s
    for a job that never existed and got 409, until the key expired a day later."""
    monkeypatch.setenv("CONVEYOR_REPLICA_ACKS", "1")
    monkeypatch.setenv("CONVEYOR_REDIS_TIMEOUT_S", "0.5")
    get_settings.cache_clear()
    claims = f"{Keys().prefix}idem:*"
    before = len(await aredis.keys(claims))
    try:
        settings = get_settings().model_copy(
            update={"redis_url": redis_url, "auth": "disabled", "instance_id": "unconfirmed"}
        )
        app = create_app(settings)
        body, headers = {"model": "identity", "inputs": {}}, {"Idempotency-Key": "order-8"}
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://localhost"
            ) as client:
                answers = [await client.post("/v1/jobs", json=body, headers=headers) for _ in "12"]
    finally:
        get_settings.cache_clear()
    assert [a.status_code for a in answers] == [503, 503], [a.text for a in answers]
    assert len(await aredis.keys(claims)) == before


async def test_a_claim_or_take_over_rerun_after_its_reply_was_lost_is_its_own(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py resends a command whose connection dropped after the server ran it: the rerun
    SET NX found the key taken (by itself), waited for its own job and answered 409; a rerun
    take-over found the claim changed (by itself) and gave up."""
    monkeypatch.setattr(admission, "IN_PROGRESS_WAIT_S", 0.3)
    keys, store = _stores(aredis)
    mine = new_job_id("m", "default")
    assert await keys.claim(TENANT, KEY, mine, BODY, store.exists) is None
    assert await keys.claim(TENANT, KEY, mine, BODY, store.exists) is None  # the rerun
    abandoned = admission.Claim(new_job_id("m", "default"), BODY, 0)
    taker = admission.Claim.new(new_job_id("m", "default"), BODY)
    await aredis.set(keys._key(TENANT, "other"), abandoned.value())
    assert await keys._taken_over(TENANT, "other", abandoned, taker)
    assert await keys._taken_over(TENANT, "other", abandoned, taker)  # the rerun


def test_a_body_with_its_keys_in_another_order_is_the_same_body() -> None:
    """JSON objects have no order: a retry that serialises the same inputs differently (another
    client library, a dict rebuilt) is the same request, not a 409 conflict; so is a retry of a
    request whose claim a producer before sorted keys made (the JSON as sent)."""
    first = {"model": "m", "inputs": {"text": "hi", "options": {"a": 1, "b": [1, 2]}}}
    reordered = {"inputs": {"options": {"b": [1, 2], "a": 1}, "text": "hi"}, "model": "m"}
    assert BodyPrint.of(reordered).matches(BodyPrint.of(first).value)
    older_producer = hashlib.sha256(dumps(first)).hexdigest()
    assert BodyPrint.of(first).matches(older_producer)
    changed = {"model": "m", "inputs": {"text": "hi", "options": {"a": 1, "b": [2, 1]}}}
    assert not BodyPrint.of(changed).matches(BodyPrint.of(first).value)
    assert not BodyPrint.of(changed).matches(older_producer)


async def test_a_retry_whose_deadline_passed_while_it_waited_on_the_key_is_refused(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A keyed submit checked its deadline before waiting for an earlier try's claim (up to
    IN_PROGRESS_WAIT_S); should that try then give the key up, the retry enqueued its job with
    the deadline passed meanwhile (202, then `expired`), where a past deadline is a 422 and
    nothing enqueued. The producer runs in-process, on a real Valkey."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    spec = KeySpec(tenant=tenant, scopes=frozenset({"submit", "read"}))
    api_key, _ = await ApiKeyStore(aredis, Keys()).create(spec)
    app = create_app(Settings(redis_url=redis_url, instance_id="late-retry"))
    body = {"model": "identity", "inputs": {"x": tenant}, "deadline": 0.0}
    headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": "order-9"}
    keys = IdempotencyKeys(aredis, Keys(), 60)
    first = new_job_id("identity", "default")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            body["deadline"] = time.time() + 0.5
            request = PredictRequest.model_validate({k: v for k, v in body.items() if k != "model"})
            print_ = BodyPrint.of({"model": body["model"], **request.model_dump(mode="json")})
            # the first try holds the key, its job not enqueued yet
            assert await keys.claim(tenant, "order-9", first, print_, aredis.exists) is None
            retry = asyncio.create_task(client.post("/v1/jobs", json=body, headers=headers))
            await asyncio.sleep(1.0)  # past the deadline, the retry still waiting on the key
            assert not retry.done()
            await keys.release(tenant, "order-9", first)  # the first try failed (queue full)
            answer = await asyncio.wait_for(retry, 10)
    assert answer.status_code == 422, answer.text
    assert "deadline: already past" in answer.json()["error"]["message"]
    entries = await aredis.xrange(Keys().queue("identity", "default"))
    assert not any(f.get(b"tenant", b"").decode() == tenant for _, f in entries)

"""A batch create's Idempotency-Key while its create runs long, on a real Valkey with a producer
served in-process: a retry took the key's claim over as abandoned once it was ABANDONED_AFTER_S
old (60 s; a big input and a slow Redis can keep a create `validating` that long) and created
the batch a second time, every line run twice. The create now keeps its claim young, so a retry
waits for its batch; a claim whose producer died still frees the key. ABANDONED_AFTER_S is set
on the module (no setting names it) to a fraction of a second, and a batch of many lines keeps
its create busy longer than that."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.batch_api.serving import Asked
from producer_api.errors import ConveyorError
from producer_api.jobs import admission
from producer_api.jobs.admission import BodyPrint, IdempotencyKeys
from shared.api_keys import ApiKeyStore, KeySpec
from shared.batch_api_store import BatchApiStore
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("batch-idem-r27:")
TENANT = "acme"
ABANDONED_AFTER_S = 0.2  # a create of LINES lines takes two to three times that here
LINES = 20_000
TTL_S = 3600


def _lines(n: int) -> bytes:
    return "".join(
        json.dumps({"custom_id": f"c{i}", "body": {"inputs": {"n": i}}}) + "\n" for i in range(n)
    ).encode()


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix))
    async with app_client(app) as client:
        yield client


@pytest.fixture
async def auth(aredis: aioredis.Redis) -> dict[str, str]:
    spec = KeySpec(tenant=TENANT, scopes=frozenset({"submit", "read"}))
    api_key, _ = await ApiKeyStore(aredis, KEYS).create(spec)
    return {"Authorization": f"Bearer {api_key}"}


async def _create(
    client: httpx.AsyncClient, auth: dict[str, str], key: str, source: bytes
) -> httpx.Response:
    headers = {**auth, "Content-Type": "application/jsonl", "Idempotency-Key": key}
    return await client.post(
        "/v1/batches", params={"model": "identity"}, content=source, headers=headers
    )


async def test_a_retry_during_a_long_create_answers_its_batch_not_a_second_one(
    producer: httpx.AsyncClient, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tries sent together (a client's retry after its first timed out): one claims the
    key and spends longer than ABANDONED_AFTER_S enqueueing its lines; the other waits for it
    (IN_PROGRESS_WAIT_S, 5 s) and answers with its batch. It took the claim over and made
    a second batch of the same lines."""
    monkeypatch.setattr(admission, "ABANDONED_AFTER_S", ABANDONED_AFTER_S)
    source = _lines(LINES)
    first, retry = await asyncio.gather(
        _create(producer, auth, "big-1", source), _create(producer, auth, "big-1", source)
    )
    assert first.status_code == retry.status_code == 202, (first.text, retry.text)
    assert retry.json()["id"] == first.json()["id"]
    listed = await producer.get("/v1/batches", headers=auth)
    assert [batch["id"] for batch in listed.json()["data"]] == [first.json()["id"]]


async def test_a_create_whose_producer_died_frees_its_key(
    producer: httpx.AsyncClient,
    auth: dict[str, str],
    aredis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a producer killed mid-create leaves, written as its create wrote it: the key's claim
    and a batch `validating`, never renewed again. A retry takes the claim over once it is
    ABANDONED_AFTER_S old and creates the batch, rather than waiting for one that never comes."""
    monkeypatch.setattr(admission, "ABANDONED_AFTER_S", ABANDONED_AFTER_S)
    source, dead = _lines(3), f"batch_{uuid.uuid4().hex}"
    body_print = Asked(source, {"model": "identity", "completion_window": "24h"}).body_print()
    assert (
        await IdempotencyKeys(aredis, KEYS, TTL_S).claim(TENANT, "died-1", dead, body_print, _never)
        is None
    )
    await BatchApiStore(aredis, KEYS, TTL_S).create(dead, {"tenant": TENANT}, TTL_S)
    await asyncio.sleep(ABANDONED_AFTER_S)

    retry = await _create(producer, auth, "died-1", source)
    assert retry.status_code == 202, retry.text
    assert retry.json()["id"] != dead and retry.json()["status"] == "in_progress"
    again = await _create(producer, auth, "died-1", source)
    assert again.status_code == 202 and again.json()["id"] == retry.json()["id"], again.text


async def _never(batch_id: str) -> bool:
    return False


async def test_a_claim_renewed_after_a_retry_read_it_is_not_taken_over(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry reads the claim ABANDONED_AFTER_S old (its create's renewals late: a busy
    producer, a slow Redis), and the renewal lands while the retry looks for the batch: the
    retry must not take the renewed claim over (it matched the claim by its batch id alone)."""
    monkeypatch.setattr(admission, "ABANDONED_AFTER_S", ABANDONED_AFTER_S)
    monkeypatch.setattr(admission, "IN_PROGRESS_WAIT_S", ABANDONED_AFTER_S)
    keys, body_print = IdempotencyKeys(aredis, KEYS, TTL_S), BodyPrint("lines")
    creating = f"batch_{uuid.uuid4().hex}"
    assert await keys.claim(TENANT, "late-1", creating, body_print, _never) is None
    await asyncio.sleep(ABANDONED_AFTER_S)  # no renewal yet: the claim reads abandoned

    async def started_meanwhile(batch_id: str) -> bool:
        await asyncio.sleep(ABANDONED_AFTER_S / admission.RENEWALS * 2)  # a renewal lands
        return False

    async with keys.kept(TENANT, "late-1", creating, body_print):
        with pytest.raises(ConveyorError) as refused:  # still being created: retry later
            await keys.claim(TENANT, "late-1", "batch_retry", body_print, started_meanwhile)
    assert refused.value.status == 409

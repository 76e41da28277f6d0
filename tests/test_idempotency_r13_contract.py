"""What a client of `Idempotency-Key` is promised (README, Delivery guarantees), on producers
served in-process over a real Valkey with API keys enforced and no worker: submits with one key
racing, on one producer or two, make one job (a batch create's too); keys are each tenant's; a
refused submit leaves its key free; a claim whose job never appeared is taken over a minute on;
a malformed key is a 422 that says why; a key lives twice the result TTL (as long as its job's
record may); and a repeated submit-and-wait
answers with the first job's result."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.jobs.admission import BodyPrint, Claim, IdempotencyKeys
from producer_api.jobs.protocol import JobRequest
from shared.api_keys import ApiKeyStore, KeySpec
from shared.codec import dumps
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

JOBS, PREDICT = "/v1/jobs", "/v1/models/identity/predict"
LANE = Keys().queue("identity", "default")


@dataclass
class Producer:
    """Two producers' clients, the first one's stores, a Redis client of the test's and one API
    key's headers per tenant (`solo`'s may hold one job in flight)."""

    client: httpx.AsyncClient
    other: httpx.AsyncClient
    store: JobStore
    claims: IdempotencyKeys
    redis: aioredis.Redis
    auth: dict[str, dict[str, str]]

    def keyed(self, tenant: str, key: str) -> dict[str, str]:
        return {**self.auth[tenant], "Idempotency-Key": key}

    async def jobs_of(self, tenant: str) -> list[str]:
        """The ids of the jobs `tenant` has in the identity lane."""
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await self.redis.xrange(LANE))
        return [f[b"id"].decode() for _, f in entries if f.get(b"tenant", b"").decode() == tenant]


@pytest.fixture(scope="module")
async def producer(redis_url: str) -> AsyncIterator[Producer]:
    client = aioredis.Redis.from_url(redis_url)
    await client.flushdb()
    api_keys = ApiKeyStore(client, Keys())
    auth = {}
    for tenant, in_flight in (("alpha", None), ("beta", None), ("gamma", None), ("solo", 1)):
        spec = KeySpec(tenant, frozenset({"submit", "read"}), max_in_flight=in_flight)
        auth[tenant] = {"Authorization": f"Bearer {(await api_keys.create(spec))[0]}"}
    first = create_app(Settings(redis_url=redis_url, instance_id="idem-r13-a"))
    second = create_app(Settings(redis_url=redis_url, instance_id="idem-r13-b"))
    async with app_client(first) as one, app_client(second) as two:
        state = first.state.conveyor
        yield Producer(one, two, state.job_store, state.idempotency, client, auth)
    await client.aclose()


def _body() -> dict[str, Any]:
    return {"model": "identity", "inputs": {"x": uuid.uuid4().hex}}


async def test_submits_racing_with_one_key_on_two_producers_make_one_job(
    producer: Producer,
) -> None:
    key, body = f"race-{uuid.uuid4().hex}", _body()
    headers = producer.keyed("alpha", key)
    clients = (producer.client, producer.other) * 2
    answers = await asyncio.gather(*(c.post(JOBS, json=body, headers=headers) for c in clients))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200, 200, 200, 202], [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert (await producer.jobs_of("alpha")).count(answers[0].json()["id"]) == 1

    bodies = [{**body, "inputs": {"x": n}} for n in range(3)]
    other_key = producer.keyed("alpha", f"{key}-b")
    raced = await asyncio.gather(
        *(producer.client.post(JOBS, json=b, headers=other_key) for b in bodies)
    )
    assert sorted(a.status_code for a in raced) == [202, 409, 409], [a.text for a in raced]


async def test_a_key_is_its_tenants_own(producer: Producer) -> None:
    key, body = f"shared-{uuid.uuid4().hex}", _body()
    alpha = await producer.client.post(JOBS, json=body, headers=producer.keyed("alpha", key))
    beta = await producer.client.post(JOBS, json=body, headers=producer.keyed("beta", key))
    other = await producer.client.post(
        JOBS, json={**body, "inputs": {"x": 0}}, headers=producer.keyed("gamma", key)
    )
    assert [a.status_code for a in (alpha, beta, other)] == [202, 202, 202], beta.text
    assert alpha.json()["id"] != beta.json()["id"]
    assert beta.json()["id"] in await producer.jobs_of("beta")


async def test_a_refused_submit_leaves_its_key_free(producer: Producer) -> None:
    """A 429 (the key's one in-flight slot taken) or a 422 (a past deadline) enqueues nothing,
    so the retry after it, once it would be accepted, makes the job; a repeat of the job that
    holds the slot answers with it, at the cap or not."""
    solo, holding = producer.auth["solo"], producer.keyed("solo", f"held-{uuid.uuid4().hex}")
    held_body = _body()
    holder = await producer.client.post(JOBS, json=held_body, headers=holding)
    key, body = f"refused-{uuid.uuid4().hex}", _body()
    headers = producer.keyed("solo", key)
    full = await asyncio.gather(
        *(producer.client.post(JOBS, json=body, headers=headers) for _ in "12")
    )
    late = await producer.client.post(JOBS, json={**body, "deadline": 1.0}, headers=headers)
    repeat = await producer.client.post(JOBS, json=held_body, headers=holding)
    assert [a.status_code for a in full] == [429, 429], [a.text for a in full]
    assert late.status_code == 422, late.text
    assert repeat.status_code == 200 and repeat.json()["id"] == holder.json()["id"], repeat.text
    await producer.client.delete(f"{JOBS}/{holder.json()['id']}", headers=solo)
    retry = await producer.client.post(JOBS, json=body, headers=headers)
    assert retry.status_code == 202, retry.text
    assert retry.json()["id"] in await producer.jobs_of("solo")
    await producer.client.delete(f"{JOBS}/{retry.json()['id']}", headers=solo)


async def test_a_claim_whose_job_never_appeared_is_taken_over_a_minute_on(
    producer: Producer,
) -> None:
    """The claim a submit could not give back (Redis went away), as it stands 61 s later: the
    retries, racing, make one job at once rather than answering 409."""
    key, body = f"lost-{uuid.uuid4().hex}", _body()
    request = JobRequest.model_validate(body).model_dump(mode="json")
    fingerprint = BodyPrint.of({"model": "identity", **request}).value
    lost = Claim(uuid.uuid4().hex, fingerprint, now_ms() - 61_000)
    claim_key = producer.claims._key("alpha", key)
    await producer.redis.set(claim_key, lost.value(), ex=600)
    headers = producer.keyed("alpha", key)
    answers = await asyncio.gather(
        *(producer.client.post(JOBS, json=body, headers=headers) for _ in "123")
    )
    assert sorted(a.status_code for a in answers) == [200, 200, 202], [a.text for a in answers]
    job_id = next(a.json()["id"] for a in answers if a.status_code == 202)
    assert {a.json()["id"] for a in answers} == {job_id}
    assert (await producer.jobs_of("alpha")).count(job_id) == 1
    assert Claim.parse(await producer.redis.get(claim_key) or b"").job_id == job_id


@pytest.mark.parametrize(
    "key", [b"k" * 10_240, b"a\x01b", b"tab\tbed", b"del\x7f", "clé".encode(), b""]
)
async def test_a_malformed_key_is_a_422_that_says_why(producer: Producer, key: bytes) -> None:
    auth = {name.encode(): value.encode() for name, value in producer.auth["alpha"].items()}
    headers = {**auth, b"Idempotency-Key": key}
    answer = await producer.client.post(JOBS, json=_body(), headers=headers)
    assert answer.status_code == 422, answer.text
    assert "Idempotency-Key: 1 to 255 printable ASCII" in answer.json()["error"]["message"]


async def test_a_key_lives_two_result_ttls_and_a_new_job_follows_it(producer: Producer) -> None:
    key, body = f"ttl-{uuid.uuid4().hex}", _body()
    headers = producer.keyed("alpha", key)
    first = await producer.client.post(JOBS, json=body, headers=headers)
    claim_key = producer.claims._key("alpha", key)
    assert 172_790 <= await producer.redis.ttl(claim_key) <= 172_800  # claim_ttl_s: twice
    await producer.redis.delete(claim_key)  # CONVEYOR_RESULT_TTL_S ran out
    later = await producer.client.post(JOBS, json=body, headers=headers)
    assert (first.status_code, later.status_code) == (202, 202), later.text
    assert first.json()["id"] != later.json()["id"]


async def test_a_repeated_predict_answers_with_the_first_jobs_result(producer: Producer) -> None:
    """On the other producer too, and through `POST /v1/jobs?wait` (one request, either route)."""
    key, body = f"wait-{uuid.uuid4().hex}", {"inputs": {"x": uuid.uuid4().hex}}
    headers = producer.keyed("alpha", key)
    first = await producer.client.post(
        PREDICT, params={"timeout": 0.05}, json=body, headers=headers
    )
    assert first.status_code == 202, first.text
    job_id = first.json()["id"]
    await producer.store.transition(job_id, JobStatus.RUNNING, {"started": now_ms()})
    fields: dict[str, str | int] = {"outputs": dumps({"y": 42}).decode(), "finished": now_ms()}
    await producer.store.transition(job_id, JobStatus.SUCCEEDED, fields)
    again = await producer.other.post(PREDICT, params={"timeout": 5}, json=body, headers=headers)
    waited = await producer.client.post(
        JOBS, params={"wait": 5}, json={"model": "identity", **body}, headers=headers
    )
    assert (again.status_code, waited.status_code) == (200, 200), (again.text, waited.text)
    assert again.json()["id"] == waited.json()["id"] == job_id
    assert again.json()["outputs"] == waited.json()["outputs"] == {"y": 42}


async def test_batch_creates_racing_with_one_key_make_one_batch(producer: Producer) -> None:
    lines = b"".join(
        dumps({"custom_id": f"c{n}", "body": {"inputs": {"n": uuid.uuid4().hex}}}) + b"\n"
        for n in range(2)
    )
    headers = {
        **producer.keyed("beta", f"batch-{uuid.uuid4().hex}"),
        "Content-Type": "application/jsonl",
    }
    answers = await asyncio.gather(
        *(
            client.post("/v1/batches", params={"model": "identity"}, content=lines, headers=headers)
            for client in (producer.client, producer.other, producer.client)
        )
    )
    assert [a.status_code for a in answers] == [202] * 3, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    listed = await producer.client.get("/v1/batches", headers=producer.auth["beta"])
    assert [b["id"] for b in listed.json()["data"]] == [answers[0].json()["id"]]

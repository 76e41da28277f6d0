"""Submit edges: a `ttl_s` too short to leave the job any time, or one that ran out while its
keyed retry waited on an earlier try's claim, is refused as an already-past `deadline` is (422,
nothing enqueued), and two concurrent submits with one `Idempotency-Key` make one job that both
answers name."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.jobs.admission import BodyPrint, IdempotencyKeys
from producer_api.jobs.protocol import PredictRequest
from shared.keys import Keys, new_job_id
from shared.settings import Settings
from tests.app_client import app_client

JOB = {"model": "identity", "inputs": {"x": 1}}


def _settings(redis_url: str, name: str) -> Settings:
    return Settings(redis_url=redis_url, auth="disabled", instance_id=name)


async def test_a_ttl_under_a_millisecond_is_refused_and_nothing_is_enqueued(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    stream = Keys().queue("identity", "default")
    async with app_client(create_app(_settings(redis_url, "ttl-tiny"))) as client:
        before = await aredis.xlen(stream)
        answer = await client.post("/v1/jobs", json={**JOB, "ttl_s": 1e-300})
        after = await aredis.xlen(stream)
    assert answer.status_code == 422, answer.text
    assert "ttl_s" in answer.json()["error"]["message"]
    assert after == before


async def test_concurrent_submits_with_one_key_make_one_job(redis_url: str) -> None:
    headers = {"Idempotency-Key": "r9-concurrent"}
    async with app_client(create_app(_settings(redis_url, "idem-race"))) as client:
        answers = await asyncio.gather(
            *(client.post("/v1/jobs", json=JOB, headers=headers) for _ in range(4))
        )
    assert all(answer.status_code in (200, 202) for answer in answers), answers
    assert len({answer.json()["id"] for answer in answers}) == 1


async def test_a_retry_whose_ttl_ran_out_while_it_waited_on_the_key_is_refused(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The retry's deadline counts from its arrival: once its `ttl_s` has run out behind the
    first try's claim, the job could only be accepted to expire."""
    body = {"model": "identity", "inputs": {"x": "ttl-retry"}, "ttl_s": 0.2}
    request = PredictRequest.model_validate({k: v for k, v in body.items() if k != "model"})
    body_print = BodyPrint.of({"model": "identity", **request.model_dump(mode="json")})
    keys, first = IdempotencyKeys(aredis, Keys(), 60), new_job_id("identity", "default")
    headers = {"Idempotency-Key": "r9-ttl-retry"}
    async with app_client(create_app(_settings(redis_url, "ttl-retry"))) as client:
        # the first try holds the key, its job not enqueued yet
        assert await keys.claim("default", "r9-ttl-retry", first, body_print, aredis.exists) is None
        retry = asyncio.create_task(client.post("/v1/jobs", json=body, headers=headers))
        await asyncio.sleep(0.4)  # past the retry's ttl_s, the retry still waiting on the key
        assert not retry.done()
        await keys.release("default", "r9-ttl-retry", first)  # the first try failed
        answer = await asyncio.wait_for(retry, 10)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["message"].startswith("ttl_s: ")
    entries = await aredis.xrange(Keys().queue("identity", "default"))
    assert not any(b"ttl-retry" in fields.get(b"payload", b"") for _, fields in entries)

"""The console's Jobs pages over what Redis may hold beside what producers write, in-process on
a real Valkey: a queue entry that is no job (a payload that is no JSON object, as a worker
dead-letters it unread) made its job's page a 500; one partition's key of another type (an
operator's slip) made the Jobs list a 500 for every partition, and the page of each job of that
partition too, where the Overview leaves that partition out; and a status no job has (a typo)
listed no jobs rather than being refused."""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys, new_job_id
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("console-r14-jobs:")
KEPT = {"text": "kept by the worker"}


@pytest.fixture
async def client(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    await aredis.delete(KEYS.dlq("identity", "default"), KEYS.queue("identity", "default"))
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    async with app_client(create_app(settings)) as http:
        yield http


async def _failed_job(aredis: aioredis.Redis) -> str:
    """A job of identity:default as a worker fails one whose entry it could not read: its
    inputs kept in its hash."""
    job_id = new_job_id("identity", "default")
    fields = {"model": "identity", "variant": "default", "status": "failed", "tenant": "ops"}
    fields |= {"created": "1", "stream": KEYS.queue("identity", "default")}
    await aredis.hset(KEYS.job(job_id), mapping=fields | {"inputs": json.dumps(KEPT)})
    return job_id


async def test_a_job_whose_entry_is_no_job_shows_the_inputs_its_hash_kept(
    client: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    job_id = await _failed_job(aredis)
    letter = {"id": job_id, "payload": "[1]", "enq": "1", "reason": "undecodable"}
    await aredis.xadd(KEYS.dlq("identity", "default"), letter)
    page = await client.get(f"/console/jobs/{job_id}")
    assert page.status_code == 200, page.text
    inputs = re.search(r'id="job-inputs">([^<]*)<', page.text)
    assert inputs is not None, page.text
    assert json.loads(html.unescape(inputs[1])) == KEPT


async def test_a_partition_key_of_another_type_leaves_the_other_jobs_listed(
    client: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    submitted = await client.post("/v1/jobs", json={"model": "minilm", "inputs": {"texts": ["x"]}})
    assert submitted.status_code == 202, submitted.text
    job_id = await _failed_job(aredis)
    await aredis.set(KEYS.dlq("identity", "default"), "not a stream")
    await aredis.set(KEYS.queue("identity", "default"), "not a stream")
    listed = await client.get("/console/jobs")
    assert listed.status_code == 200, listed.text
    assert submitted.json()["id"] in listed.text
    page = await client.get(f"/console/jobs/{job_id}")
    assert page.status_code == 200, page.text
    assert "kept by the worker" in html.unescape(page.text)


async def test_a_job_key_of_another_type_leaves_the_other_jobs_listed(
    client: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """One job whose key an operator overwrote made the whole Jobs list a 500."""
    listed_job = await _failed_job(aredis)
    slipped = new_job_id("identity", "default")
    for job_id in (listed_job, slipped):
        await aredis.xadd(KEYS.dlq("identity", "default"), {"id": job_id, "payload": "{}"})
    await aredis.set(KEYS.job(slipped), "not a hash")
    listed = await client.get("/console/jobs")
    assert listed.status_code == 200, listed.text
    assert listed_job in listed.text and slipped not in listed.text


async def test_a_status_no_job_has_is_refused_not_listed_as_no_match(
    client: httpx.AsyncClient,
) -> None:
    """A mistyped status (`faild`) drew "No jobs match" over a partition full of failed jobs;
    the form's "any status" sends it empty."""
    refused = await client.get("/console/jobs", params={"status": "faild"})
    assert refused.status_code == 422, refused.text
    assert "faild" in refused.json()["error"]["message"]
    assert "default-src 'none'" in refused.headers["content-security-policy"]
    assert (await client.get("/console/jobs", params={"status": ""})).status_code == 200

"""What README's API table says of jobs not run yet and of canaries. A queued job's view has
`queue_position` and `eta_ms` but no `batch_size` nor `attempts` (only a worker's run writes
them), and a `?wait` or `?timeout` past `CONVEYOR_MAX_WAIT_S` waits only that long, answering
the 202 of a job not ended. A canary is refused (409) for a variant that already serves more
than its first step, and so is an abort with none running. A producer served in-process over a
real Valkey; no worker, so every job stays queued."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client

JOB = {"model": "identity", "inputs": {"x": 1}}
# Far below the 600 s a route takes: a wait not held to the cap runs into `asyncio.timeout`.
MAX_WAIT_S = 0.2


@pytest.fixture
async def producer(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        redis_url=redis_url, auth="disabled", instance_id="readme-api-r17", max_wait_s=MAX_WAIT_S
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def test_a_queued_jobs_view_has_its_standing_but_no_run_counts(
    producer: httpx.AsyncClient,
) -> None:
    job_id = (await producer.post("/v1/jobs", json=JOB)).json()["id"]
    view = (await producer.get(f"/v1/jobs/{job_id}")).json()
    assert view["status"] == "queued"
    assert {"queue_position", "eta_ms", "timings"} <= view.keys(), view
    assert not {"batch_size", "attempts"} & view.keys(), view
    lax = await producer.get(f"/v1/jobs/{job_id}?attempts=yes")
    assert lax.status_code == 422, lax.text


async def test_a_wait_past_the_cap_answers_the_202_of_a_job_not_ended(
    producer: httpx.AsyncClient,
) -> None:
    async with asyncio.timeout(10):
        submitted = await producer.post("/v1/jobs?wait=600", json=JOB)
        predicted = await producer.post(
            "/v1/models/identity/predict?timeout=600", json={"inputs": JOB["inputs"]}
        )
    for answer in (submitted, predicted):
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "queued"
        assert answer.headers["Location"].endswith(f"/v1/jobs/{answer.json()['id']}")


async def test_a_canary_with_nothing_to_step_from_or_to_abort_is_a_409(
    producer: httpx.AsyncClient,
) -> None:
    baseline = await producer.post(
        "/v1/models/identity/canary", json={"variant": "default", "baseline": "canary"}
    )
    assert baseline.status_code == 409, baseline.text
    assert "already serves 100 %" in baseline.json()["error"]["message"]
    aborted = await producer.delete("/v1/models/identity/canary")
    assert aborted.status_code == 409, aborted.text
    assert "no canary running" in aborted.json()["error"]["message"]

"""A job-events resume whose Last-Event-ID spells an entry id with leading zeros (`00-1`), on a
real Valkey with the producer in-process (no worker). Redis reads it as the id it names, but the
producer compared it as text: `00-1`, the id of a cancelled job's final, was not told 204 (the
final was sent again), and `00-0` on an ended job that streams no tokens reached Redis as the
range `(00-0`, which Redis refuses: a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="sse-r16-ids"))
    async with app_client(app) as client:
        yield client


async def _cancelled(client: httpx.AsyncClient, model: str, inputs: dict[str, object]) -> str:
    job_id: str = (await client.post("/v1/jobs", json={"model": model, "inputs": inputs})).json()[
        "id"
    ]
    assert (await client.delete(f"/v1/jobs/{job_id}")).json()["status"] == "cancelled"
    return job_id


@pytest.mark.parametrize(
    ("model", "inputs"), [("identity", {"x": 1}), ("smollm2", {"prompt": "hi"})]
)
async def test_an_id_with_leading_zeros_resumes_as_the_id_it_names(
    client: httpx.AsyncClient, model: str, inputs: dict[str, object]
) -> None:
    job_id = await _cancelled(client, model, inputs)
    url = f"/v1/jobs/{job_id}/events"
    start = await client.get(url, headers={"Last-Event-ID": "00-0"})
    assert start.status_code == 200, start.text
    assert "event: final" in start.text and "id: 0-1" in start.text
    assert (await client.get(url, headers={"Last-Event-ID": "00-01"})).status_code == 204

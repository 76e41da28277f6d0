"""A job id of any length that is not shaped as one is an unknown job (404), on every jobs route
that takes one, as a 32-character one not shaped as one is and as the console reads it: an id
past 128 characters was a 422 about the path's length, which a client that tells a gone job by
its 404 read as a bad request of its own."""

from __future__ import annotations

import pytest

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client

LONG_IDS = ("e" * 129, "eaac" * 100)


@pytest.mark.parametrize("job_id", LONG_IDS)
async def test_a_long_malformed_id_is_an_unknown_job(redis_url: str, job_id: str) -> None:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="r8-ids")
    async with app_client(create_app(settings)) as client:
        answers = [
            await client.get(f"/v1/jobs/{job_id}"),
            await client.get(f"/v1/jobs/{job_id}?wait=0.1&attempts=true"),
            await client.delete(f"/v1/jobs/{job_id}"),
            await client.get(f"/v1/jobs/{job_id}/events"),
        ]
    for answer in answers:
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["type"] == "not_found"

"""What a client sent is quoted back cut short, never whole: a vLLM model's unknown parameter
named in 100 kB (a batch model's was already cut), and a job id of 10 kB on the jobs routes,
each came back whole in its error."""

from __future__ import annotations

from producer_api.app import create_app
from shared.model_repository import QUOTED_CHARS
from shared.settings import Settings
from tests.app_client import app_client

LONG = 100_000
# the message's own words around the quoted name, well under this
SHORT_MESSAGE = QUOTED_CHARS + 400


def _settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, auth="disabled", instance_id="r34-quoted")


async def test_an_unknown_parameter_of_a_vllm_model_is_quoted_short(redis_url: str) -> None:
    async with app_client(create_app(_settings(redis_url))) as client:
        answer = await client.post(
            "/v1/jobs",
            json={"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"x" * LONG: 1}},
        )
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["message"].startswith('parameters."xxx')
    assert f"({LONG + 2} characters of JSON)" in error["message"]
    assert len(error["message"]) < SHORT_MESSAGE


async def test_a_long_job_id_is_quoted_short_in_its_404(redis_url: str) -> None:
    job_id = "e" * 10_000
    async with app_client(create_app(_settings(redis_url))) as client:
        answers = [
            await client.get(f"/v1/jobs/{job_id}"),
            await client.get(f"/v1/jobs/{job_id}?wait=0.1"),
            await client.delete(f"/v1/jobs/{job_id}"),
        ]
        short = await client.get("/v1/jobs/a%20b")
    for answer in answers:
        assert answer.status_code == 404, answer.text
        message = answer.json()["error"]["message"]
        assert message.startswith('job "eee') and message.endswith(" not found"), message[:300]
        assert len(message) < SHORT_MESSAGE
    assert short.json()["error"]["message"] == "job a b not found"  # a short id, as sent

"""`/metrics` answers in the text format whatever the scrape asks for: Prometheus asks for
OpenMetrics first, where a process that loaded a vLLM engine exports two families whose names
clash (`vllm_prompt_tokens_by_source`), and one clash fails the whole scrape, every series of
the producer or worker with it."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_worker_metrics_server import worker_url  # noqa: F401 (the fixture)

OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4"


def _families(response: httpx.Response) -> set[str]:
    """The families a text-format answer holds, read with the text format's parser."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {family.name for family in text_string_to_metric_families(response.text)}


async def test_the_producer_answers_the_text_format_when_asked_for_openmetrics(
    redis_url: str,
) -> None:
    settings = Settings(redis_url=redis_url, key_prefix="metrics-r12-om:", auth="disabled")
    async with app_client(create_app(settings)) as client:
        await client.get("/healthz")  # a request counted before the scrape
        asked = await client.get("/metrics", headers={"accept": OPENMETRICS})
    assert "conveyor_http_requests" in _families(asked)


def test_a_worker_answers_the_text_format_when_asked_for_openmetrics(
    worker_url: str,  # noqa: F811
) -> None:
    asked = httpx.get(f"{worker_url}/metrics", headers={"accept": OPENMETRICS}, timeout=10)
    assert "conveyor_engine_seconds" in _families(asked)

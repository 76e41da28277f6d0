"""`/metrics` answers in the format the scraper asks for: Prometheus asks for OpenMetrics first,
and both the producer and a worker answered in the text format whatever it asked, where each
counter's and histogram's `_created` is a gauge series of its own."""

from __future__ import annotations

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as text_format

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_worker_metrics_server import worker_url  # noqa: F401 (the fixture)

OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4"


def _families(response: httpx.Response) -> set[str]:
    """The families an OpenMetrics answer holds, read with OpenMetrics' own parser."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    return {family.name for family in openmetrics(response.text)}


async def test_the_producer_answers_openmetrics_when_asked(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url, key_prefix="metrics-r12-om:", auth="disabled")
    async with app_client(create_app(settings)) as client:
        await client.get("/healthz")  # a request counted before the scrape
        asked = await client.get("/metrics", headers={"accept": OPENMETRICS})
        plain = await client.get("/metrics")
    assert "conveyor_http_requests" in _families(asked)
    assert plain.headers["content-type"].startswith("text/plain")
    names = {family.name for family in text_format(plain.text)}
    assert "conveyor_http_requests" in names


def test_a_worker_answers_openmetrics_when_asked(worker_url: str) -> None:  # noqa: F811
    asked = httpx.get(f"{worker_url}/metrics", headers={"accept": OPENMETRICS}, timeout=10)
    assert "conveyor_engine_seconds" in _families(asked)
    plain = httpx.get(f"{worker_url}/metrics", timeout=10)
    assert plain.headers["content-type"].startswith("text/plain")
    assert "conveyor_engine_seconds" in {family.name for family in text_format(plain.text)}

"""One client could spread the producer's HTTP metrics over methods: every route answers an
unknown method 405 before any key is asked for, so each method it sends was a counter and a
latency histogram of its own per route. Only the methods the app serves are label values; the
rest (TRACE and CONNECT included: no route takes them) read `other`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import REGISTRY

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client

SERVED = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}
ODD = [
    "TRACE", "CONNECT", "PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK",
    "PURGE", "SEARCH", "REPORT", "LINK", "UNLINK", "BIND", "REBIND", "ACL", "SOURCE", "FOO",
    "CHECKOUT",
]  # fmt: skip


@pytest.fixture(scope="module")
async def client(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, key_prefix="metrics-r38:", auth="disabled")
    async with app_client(create_app(settings)) as served:
        yield served


def _methods(route: str) -> dict[str, float]:
    """The request count per `method` label value on `route`, over every status."""
    counts: dict[str, float] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == "conveyor_http_requests_total" and sample.labels["route"] == route:
                method = sample.labels["method"]
                counts[method] = counts.get(method, 0.0) + sample.value
    return counts


async def test_methods_the_app_does_not_serve_are_one_series(client: httpx.AsyncClient) -> None:
    before = _methods("/v1/jobs/{job_id}").get("other", 0.0)
    for method in ODD:
        answer = await client.request(method, "/v1/jobs/abc")
        assert answer.status_code == 405, (method, answer.status_code)
    after = _methods("/v1/jobs/{job_id}")
    assert set(after) - SERVED == {"other"}, sorted(after)
    assert after["other"] == before + len(ODD)

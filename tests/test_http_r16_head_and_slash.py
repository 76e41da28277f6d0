"""HTTP semantics at the producer's edge, on a producer served in-process over a real Valkey
(nothing reaches a worker). A HEAD to any GET route is answered as its GET without a body: only
the probes took HEAD, so a load balancer or uptime checker sending HEAD to a job, /v1/models or
/metrics got 405. A path with a stray trailing slash is redirected with a relative Location:
Starlette's absolute one was built from the request's scheme and Host, so behind a proxy that
ends TLS it sent clients to `http://`, and it echoed a Host the client made up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urljoin

import httpx
import pytest

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client

JOB = {"model": "identity", "inputs": {"x": 1}}


@pytest.fixture(scope="module")
async def producer(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="http-r16-head")
    async with app_client(create_app(settings)) as client:
        yield client


async def _job_id(producer: httpx.AsyncClient) -> str:
    accepted = await producer.post("/v1/jobs", json=JOB)
    assert accepted.status_code == 202, accepted.text
    job_id: str = accepted.json()["id"]
    return job_id


@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/v1/jobs/{id}", "/v1/jobs/missing"])
async def test_head_is_answered_as_get_without_a_body(
    producer: httpx.AsyncClient, path: str
) -> None:
    if "{id}" in path:
        path = path.format(id=await _job_id(producer))
    got = await producer.get(path)
    head = await producer.head(path)
    assert (head.status_code, head.content) == (got.status_code, b""), head.headers
    assert head.headers["content-type"] == got.headers["content-type"]


async def test_head_to_a_stream_ends_once_its_headers_are_sent(
    producer: httpx.AsyncClient,
) -> None:
    events = f"/v1/jobs/{await _job_id(producer)}/events"
    head = await asyncio.wait_for(producer.head(events), timeout=5)
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-type"].startswith("text/event-stream")


async def test_head_to_a_path_that_takes_no_get_is_still_405_with_allow(
    producer: httpx.AsyncClient,
) -> None:
    answer = await producer.head("/v1/jobs")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "POST"


@pytest.mark.parametrize(
    ("method", "sent", "location"),
    [
        ("GET", "/v1/models/?limit=2", "../models?limit=2"),
        ("POST", "/v1/jobs/", "../jobs"),
        ("GET", "/v1/jobs/some%20id/", "../some%20id"),
        ("GET", "/console/", "../console"),
        ("GET", "/v1/models/minilm/routes/", "../routes"),
    ],
)
async def test_a_stray_slash_redirects_relative_whatever_the_host(
    producer: httpx.AsyncClient, method: str, sent: str, location: str
) -> None:
    # a Host other than the client's that auth disabled still serves (request_boundary)
    headers = {"Host": "evil.localhost", "Content-Type": "application/json"}
    answer = await producer.request(method, sent, headers=headers, content=b"{}")
    assert answer.status_code == 307
    assert answer.headers["location"] == location
    # resolved against the URL the client sent, under whatever prefix a proxy in front strips
    twin = sent.split("?")[0].rstrip("/") if sent.split("?")[0].endswith("/") else f"{sent}/"
    assert urljoin(f"https://example.com/prefix{sent}", location).startswith(
        f"https://example.com/prefix{twin}"
    )


async def test_a_path_no_route_takes_either_way_is_404_in_the_error_shape(
    producer: httpx.AsyncClient,
) -> None:
    for path in ("/v1/nowhere/", "/v1/models//"):  # `//`: two slashes from a route
        answer = await producer.get(path)
        assert answer.status_code == 404
        assert answer.json()["error"]["type"] == "not_found"


async def test_a_head_is_counted_under_the_route_that_answered_it(
    producer: httpx.AsyncClient,
) -> None:
    await producer.head("/v1/models")
    scraped = (await producer.get("/metrics")).text
    assert 'method="HEAD",route="/v1/models",status="200"' in scraped

"""`conveyor_http_request_seconds` reads a request as long as the API lets one wait: a long-poll
(`wait`) or a predict's `timeout` may hold its request 600 s, and with buckets topped at 60 s
every quantile of those routes read 60 however long they took."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


def _longest_wait_s(schema: dict[str, Any]) -> float:
    """The largest `maximum` of any route's `wait` or `timeout` query parameter."""
    return max(
        float(parameter["schema"]["maximum"])
        for path in schema["paths"].values()
        for operation in path.values()
        for parameter in operation.get("parameters", [])
        if parameter["name"] in ("wait", "timeout") and "maximum" in parameter["schema"]
    )


def test_http_latency_buckets_reach_the_longest_wait_a_request_may_hold(base_url: str) -> None:
    longest = _longest_wait_s(httpx.get(f"{base_url}/openapi.json", timeout=10).json())
    assert longest >= 600  # parsed: the predict timeout's and the long-poll's bound
    text = httpx.get(f"{base_url}/metrics", timeout=10).text  # after a request of its own
    bounds = {
        float(sample.labels["le"])
        for family in text_string_to_metric_families(text)
        if family.name == "conveyor_http_request_seconds"
        for sample in family.samples
        if sample.name.endswith("_bucket")
    }
    assert max(bounds - {float("inf")}) >= longest

"""`conveyor_http_requests_total` names the route a request was for when the request boundary
refused its body (422, 413) before routing: those read `route="unmatched"`, as a path that
matches no route does, so a client's bad bodies could not be told apart by route."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def _requests(base_url: str, route: str, status: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "conveyor_http_requests_total"
        and sample.labels == {"method": "POST", "route": route, "status": status}
    )


def test_a_body_refused_before_routing_counts_under_its_route(base_url: str) -> None:
    before = _requests(base_url, "/v1/jobs", "422")
    body = b'{"model": "identity", "inputs": {"x": 1e999}}'  # not finite: the boundary's 422
    response = httpx.post(f"{base_url}/v1/jobs", content=body, timeout=10)
    assert response.status_code == 422, response.text
    assert _requests(base_url, "/v1/jobs", "422") == before + 1


def test_a_path_no_route_matches_stays_unmatched(base_url: str) -> None:
    before = _requests(base_url, "unmatched", "404")
    response = httpx.post(f"{base_url}/v1/no-such-resource/123", json={}, timeout=10)
    assert response.status_code == 404
    assert _requests(base_url, "unmatched", "404") == before + 1


def test_what_a_client_names_never_becomes_a_label_value(base_url: str) -> None:
    """Unknown models, variants, job ids, paths and methods are each refused, never a series of
    their own: 10,000 bogus names would have been 10,000 series in every scrape."""
    name = "bogus7f3a"
    with httpx.Client(base_url=base_url, timeout=10) as client:
        answers = [
            client.post("/v1/jobs", json={"model": name, "inputs": {}}),
            client.post(f"/v1/models/{name}/predict", json={"inputs": {}}),
            client.post("/v1/models/identity/predict", json={"variant": name, "inputs": {}}),
            client.post("/v1/completions", json={"model": name, "prompt": "a"}),
            client.get(f"/v1/jobs/{name}"),
            client.get(f"/{name}/{name}"),
            client.request(name.upper(), "/v1/jobs"),
        ]
    assert all(400 <= a.status_code < 500 for a in answers), [a.status_code for a in answers]
    assert name not in httpx.get(f"{base_url}/metrics", timeout=10).text.lower()


def test_a_method_outside_rfc_9110_is_no_label_value(base_url: str) -> None:
    """Each method the HTTP parser knows (WebDAV's, PURGE: some 30) sent to any route had become
    a `method` series of its own, per route and status (a route answers 405 before its key is
    asked for): thousands of series from one client. Methods outside RFC 9110's read `other`."""
    before = _count(base_url, {"method": "other", "route": "/healthz", "status": "405"})
    names = ["PROPFIND", "MKCOL", "PURGE"]
    with httpx.Client(base_url=base_url, timeout=10) as client:
        assert {client.request(name, "/healthz").status_code for name in names} == {405}
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    assert not any(f'method="{name}"' in text for name in names)
    after = _count(base_url, {"method": "other", "route": "/healthz", "status": "405"})
    assert after == before + len(names)


def _count(base_url: str, labels: dict[str, str]) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "conveyor_http_requests_total" and sample.labels == labels
    )

"""The worker's `/metrics` and `/healthz` (workers/runtime/metrics_server.py) answer what a probe
or scraper sends: HEAD as GET (a load balancer's or monitor's `HEAD /healthz` got 501, a healthy
worker taken for down) and a path with a query string (a Prometheus job's `params:` sends
`/metrics?...`, which got 404 and a target down)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from types import SimpleNamespace

import httpx
import pytest

from workers.runtime.metrics_server import _handler


@pytest.fixture
def worker_url() -> Iterator[str]:
    """The worker's handler on a free port, for a worker whose engines are still loading (no
    consumer runtime yet): `/healthz` 503, `/metrics` 200."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(SimpleNamespace()))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(("path", "status"), [("/healthz", 503), ("/metrics", 200)])
def test_head_answers_as_get(worker_url: str, path: str, status: int) -> None:
    got = httpx.get(f"{worker_url}{path}", timeout=5)
    head = httpx.head(f"{worker_url}{path}", timeout=5)
    assert got.status_code == status
    assert (head.status_code, head.content) == (status, b""), head.headers
    assert head.headers["content-type"] == got.headers["content-type"]


@pytest.mark.parametrize(("path", "status"), [("/healthz?probe=1", 503), ("/metrics?a=b", 200)])
def test_a_query_string_names_the_same_endpoint(worker_url: str, path: str, status: int) -> None:
    assert httpx.get(f"{worker_url}{path}", timeout=5).status_code == status


def test_an_unknown_path_is_404(worker_url: str) -> None:
    assert httpx.get(f"{worker_url}/nope", timeout=5).status_code == 404

"""Probes and scrapes stay untraced under uvicorn --root-path, and requests whose own path
ends in a probe's name (a model or job called `metrics`) keep their spans."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from producer_api.app import UNTRACED, create_app
from shared.settings import Settings
from tests.span_capture import captured_spans  # noqa: F401 (`spans`)


def test_probes_under_a_root_path_go_untraced_and_routes_named_like_them_do_not(
    spans: InMemorySpanExporter,
) -> None:
    """The instrumentor matches scheme://host + the ASGI path, which under uvicorn --root-path
    starts with the root path: `^.../healthz` traced a span per kubelet probe."""
    app = create_app(Settings(auth="disabled"))
    FastAPIInstrumentor.instrument_app(app, excluded_urls=UNTRACED)
    # uvicorn puts the root path in `path` too; no lifespan (no Redis): routes answer errors
    paths = ["/healthz", "/readyz", "/metrics", "/metrics/backlog/m/default"]
    paths += ["/v1/models/metrics", "/v1/jobs/healthz", "/v1/models/readyz/routes"]
    paths += ["/console/jobs/metrics"]
    for root in ("", "/conveyor", "/api/v1"):
        client = TestClient(app, root_path=root, raise_server_exceptions=False)
        for path in paths:
            client.get(root + path)
    traced = [s.name for s in spans.get_finished_spans() if s.kind == trace.SpanKind.SERVER]
    routes = ["GET /v1/models/{model}", "GET /v1/jobs/{job_id}", "GET /v1/models/{model}/routes"]
    routes += ["GET /console/jobs/{job_id}"]
    assert traced == routes * 3, traced

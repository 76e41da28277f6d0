"""Which exporter the standard OpenTelemetry variables choose: OTLP over HTTP when
`OTEL_EXPORTER_OTLP_PROTOCOL` says `http/protobuf` (a collector's or Jaeger's port 4318: gRPC was
sent there and every span was lost), several exporters in one list, and a name or protocol this
build cannot export with refused in one line rather than exporting nowhere in silence."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from shared.telemetry import configure_tracing
from tests.conftest import running_stack, until


@contextmanager
def otlp_http_receiver() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """A collector's OTLP/HTTP trace endpoint on a free port: its URL, and what it received."""
    received: list[ExportTraceServiceRequest] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/v1/traces":
                received.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def _span_names(received: list[ExportTraceServiceRequest], service: str) -> set[str]:
    return {
        span.name
        for request in received
        for resource_spans in request.resource_spans
        if any(a.value.string_value == service for a in resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    }


def test_otlp_over_http_reaches_an_http_collector(tmp_path: Path) -> None:
    with otlp_http_receiver() as (endpoint, received):
        env = {
            "CONVEYOR_AUTH": "disabled",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": "producer-over-http",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
        with running_stack(tmp_path, **env) as stack:
            assert httpx.get(f"{stack.base_url}/v1/models", timeout=10).status_code == 200
            until(lambda: "GET /v1/models" in _span_names(received, "producer-over-http"), 20)


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin"),
        ({"OTEL_TRACES_EXPORTER": "console,jaegr"}, "OTEL_TRACES_EXPORTER=console,jaegr"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/json",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpcc"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpcc",
        ),
    ],
)
def test_an_exporter_it_cannot_use_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as refused:
        configure_tracing("conveyor-test")
    assert str(refused.value).startswith(f"Error: {named}:"), refused.value

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


def _traces(received: list[ExportTraceServiceRequest]) -> dict[tuple[str, str], set[str]]:
    """(service, span name) → the trace ids of those spans."""
    found: dict[tuple[str, str], set[str]] = {}
    for request in received:
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    key = (attributes.get("service.name", ""), span.name)
                    found.setdefault(key, set()).add(span.trace_id.hex())
    return found


def test_otlp_over_http_carries_a_request_trace_into_the_worker(tmp_path: Path) -> None:
    """Real processes, as an operator runs them against a collector's port 4318: the worker's
    batch span is in the trace of the producer's request span."""
    with otlp_http_receiver() as (endpoint, received):
        env = {
            "CONVEYOR_AUTH": "disabled",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
        with running_stack(tmp_path, **env) as stack:
            stack.start_worker("identity:default", OTEL_SERVICE_NAME="worker-over-http")
            url = f"{stack.base_url}/v1/models/identity/predict"
            response = httpx.post(url, json={"inputs": {"x": 1}}, timeout=30)
            assert response.status_code == 200, response.text

            def joined() -> bool:
                traces = _traces(received)
                request = traces.get(("conveyor-producer", "POST /v1/models/{model}/predict"))
                batch = traces.get(("worker-over-http", "batch identity:default"))
                return bool(request and batch and request & batch)

            until(joined, 20)


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

"""The spans a test's code opens, kept in memory: the `spans` fixture, which a test module
imports as `captured_spans`. One tracer provider serves the whole session: a module's tracer
(`trace.get_tracer` at import) binds to the first global provider it is used under and keeps it,
so a worker's spans went to whichever test's provider came first, and a later test with a
provider of its own saw none."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from httpx import Response
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from producer_api.app import create_app
from shared.settings import Settings
from workers.runtime.consumer_runtime import ConsumerRuntime

PROVIDER = TracerProvider()
_EXPORTER = InMemorySpanExporter()
PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture(name="spans")
def captured_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The session's provider as the global one for this test only: tracing is off again
    after it, as for every test that asks for no spans."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", PROVIDER)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def predict_in_process(settings: Settings, model: str, body: dict[str, Any]) -> Response:
    """One predict of `model` through an instrumented producer app and a worker runtime serving
    `settings.models`, both in this process."""
    runtime = ConsumerRuntime(settings)
    runtime.start()
    app = create_app(settings)
    FastAPIInstrumentor.instrument_app(app)
    try:
        with TestClient(app, base_url="http://localhost") as client:
            return client.post(f"/v1/models/{model}/predict", json=body)
    finally:
        runtime.stop()


def traced_predict(
    spans: InMemorySpanExporter, settings: Settings, model: str, body: dict[str, Any]
) -> tuple[ReadableSpan, Sequence[ReadableSpan]]:
    """One predict of `model` (200, `predict_in_process`): the request's server span, and every
    span finished by then."""
    response = predict_in_process(settings, model, body)
    assert response.status_code == 200, response.text
    finished = spans.get_finished_spans()
    server = next(s for s in finished if s.name == "POST /v1/models/{model}/predict")
    return server, finished

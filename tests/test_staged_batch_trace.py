"""A staged engine's micro-batch (minilm on ONNX Runtime) is traced as a plain engine's is: its
batch span lasts until its write-back, with its `engine` and `write` spans inside. The stage
pipeline runs the micro-batch on after the loop has moved on to read the next, and the span
ended there: it held the decode alone, the engine call had no span, and the write came after
its parent's end."""

from __future__ import annotations

from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from producer_api.app import create_app
from shared.settings import Settings
from tests.span_capture import captured_spans  # noqa: F401 (`spans`)
from workers.runtime.consumer_runtime import ConsumerRuntime


def test_a_staged_micro_batch_span_holds_its_engine_call_and_write(
    redis_url: str, spans: InMemorySpanExporter
) -> None:
    settings = Settings(
        redis_url=redis_url, key_prefix="trace-staged:", models=["minilm:default"], auth="disabled"
    )
    runtime = ConsumerRuntime(settings)
    runtime.start()
    app = create_app(settings)
    FastAPIInstrumentor.instrument_app(app)
    try:
        with TestClient(app) as client:
            body = {"inputs": {"texts": ["a staged micro-batch"]}}
            response = client.post("/v1/models/minilm/predict", json=body)
            assert response.status_code == 200, response.text
    finally:
        runtime.stop()
    finished = spans.get_finished_spans()
    server = next(s for s in finished if s.name == "POST /v1/models/{model}/predict")
    batch = next(s for s in finished if s.name == "batch minilm:default")
    assert batch.context.trace_id == server.context.trace_id
    children = {
        s.name: s for s in finished if s.parent and s.parent.span_id == batch.context.span_id
    }
    assert {"decode", "engine", "write"} <= children.keys()
    assert batch.end_time is not None
    assert all((child.end_time or 0) <= batch.end_time for child in children.values())

"""A staged engine's micro-batch (minilm on ONNX Runtime) is traced as a plain engine's is: its
batch span lasts until its write-back, with its `engine` and `write` spans inside. The stage
pipeline runs the micro-batch on after the loop has moved on to read the next, and the span
ended there: it held the decode alone, the engine call had no span, and the write came after
its parent's end."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.settings import Settings
from tests.span_capture import captured_spans, traced_predict  # noqa: F401 (`spans`)


def test_a_staged_micro_batch_span_holds_its_engine_call_and_write(
    redis_url: str, spans: InMemorySpanExporter
) -> None:
    settings = Settings(
        redis_url=redis_url, key_prefix="trace-staged:", models=["minilm:default"], auth="disabled"
    )
    body = {"inputs": {"texts": ["a staged micro-batch"]}}
    server, finished = traced_predict(spans, settings, "minilm", body)
    batch = next(s for s in finished if s.name == "batch minilm:default")
    assert batch.context.trace_id == server.context.trace_id
    children = {
        s.name: s for s in finished if s.parent and s.parent.span_id == batch.context.span_id
    }
    assert {"decode", "engine", "write"} <= children.keys()
    assert batch.end_time is not None
    assert all((child.end_time or 0) <= batch.end_time for child in children.values())

"""A generate model's job continues its request's trace into the worker, as a micro-batch does:
its generation had no span at all, so an LLM request read in Jaeger as the producer's alone."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.settings import Settings
from tests.conftest import REPO_ROOT
from tests.span_capture import captured_spans, traced_predict  # noqa: F401 (`spans`)


def test_a_generation_span_continues_its_request_trace(
    redis_url: str,
    spans: InMemorySpanExporter,
) -> None:
    settings = Settings(
        redis_url=redis_url,
        key_prefix="trace-gen:",
        model_repository=REPO_ROOT / "tests/fixtures/paced_repository",
        models=["paced:default"],
        auth="disabled",
    )
    body = {"inputs": {"prompt": "a b"}, "parameters": {"max_tokens": 2}}
    server, finished = traced_predict(spans, settings, "paced", body)
    generation = [s for s in finished if s.name == "generate paced:default"]
    assert [s.context.trace_id for s in generation] == [server.context.trace_id]
    assert [link.context.span_id for link in generation[0].links] == [server.context.span_id]

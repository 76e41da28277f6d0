"""A micro-batch's span links to every request span it served and has an event per failed job,
but the SDK keeps 128 links and 128 events per span by default: a batch of 300 kept its last 128,
so the other requests' traces (the parent's among them) lost their worker span. The provider
`configure_tracing` installs has room for the largest micro-batch, unless the standard variables
set limits of their own. The real SDK, its in-memory exporter."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, TraceFlags

from shared.telemetry import configure_tracing
from tests.test_telemetry_edges_r8_traces import installed  # noqa: F401 (a fixture)

JOBS = 300  # a micro-batch above the SDK's default 128


def _batch_span() -> tuple[int, int]:
    """Links and events kept on a span of `JOBS` links and `JOBS` failed jobs' events."""
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    links = [
        Link(SpanContext(n, n, is_remote=True, trace_flags=TraceFlags(1)))
        for n in range(1, JOBS + 1)
    ]
    span = provider.get_tracer("test").start_span("batch m:default", links=links)
    for n in range(JOBS):
        span.add_event("job failed", {"conveyor.job_id": str(n)})
    span.end()
    [finished] = exporter.get_finished_spans()
    return len(finished.links), len(finished.events)


def test_a_large_micro_batch_keeps_a_link_and_an_event_per_job(
    installed: None,  # noqa: F811
) -> None:
    assert configure_tracing("conveyor-worker")
    assert _batch_span() == (JOBS, JOBS)


def test_the_standard_limit_variables_still_rule(
    installed: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "10")
    monkeypatch.setenv("OTEL_SPAN_EVENT_COUNT_LIMIT", "20")
    assert configure_tracing("conveyor-worker")
    assert _batch_span() == (10, 20)

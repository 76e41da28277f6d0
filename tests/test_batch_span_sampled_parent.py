"""A micro-batch's span is the child of one of its requests' spans and links to each. It took the
first request's as its parent even when that one was not sampled (a ratio sampler at the
producer), and under a parent-based sampler (the SDK's default) a sampled request batched
behind an unsampled one got no worker span at all: its trace ended at the producer. The parent
is now the first sampled request's span. The real SDK, its in-memory exporter."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.codec import RequestEntry
from tests.span_capture import captured_spans  # noqa: F401 (`spans`)
from workers.batching.micro_batch_telemetry import end_span, start_batch_span
from workers.partition.stream_reader import Delivery

UNSAMPLED = "00-" + "1" * 32 + "-" + "a" * 16 + "-00"
SAMPLED = "00-" + "2" * 32 + "-" + "b" * 16 + "-01"


def _delivery(job_id: str, traceparent: str) -> Delivery:
    entry = RequestEntry(job_id, {"inputs": {}}, 0.0, traceparent=traceparent)
    return Delivery(job_id.encode(), entry, "queued", 0)


def test_a_sampled_request_behind_an_unsampled_one_gets_its_worker_span(
    spans: InMemorySpanExporter,
) -> None:
    batch = [_delivery("first", UNSAMPLED), _delivery("second", SAMPLED)]
    end_span(start_batch_span("m", "default", batch))
    [span] = spans.get_finished_spans()
    assert format(span.context.trace_id, "032x") == "2" * 32
    assert span.parent is not None and format(span.parent.span_id, "016x") == "b" * 16
    assert {format(link.context.span_id, "016x") for link in span.links} == {"a" * 16, "b" * 16}

"""A client's W3C `tracestate` (vendor sampling and routing data) reached the producer's request
span but not the worker's: the stream entry carried only the `traceparent`. It now carries the
tracestate too (field `ts`, only when there is one, within the propagator's bounds), and the
worker reads both back. A real producer app on the embedded Valkey, the real OpenTelemetry SDK
and its in-memory exporter."""

from __future__ import annotations

from typing import cast

import redis
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from starlette.testclient import TestClient

from producer_api.app import create_app
from shared.codec import RequestEntry
from shared.keys import Keys
from shared.settings import Settings
from shared.telemetry import TRACESTATE_MAX_CHARS, current_trace_context, span_context_of
from tests.span_capture import captured_spans  # noqa: F401 (`spans`)
from workers.batching.micro_batch_telemetry import end_span, start_batch_span
from workers.partition.stream_reader import Delivery

TRACEPARENT = "00-" + "3" * 32 + "-" + "c" * 16 + "-01"
TRACESTATE = "vendor=route:eu,other=s:0.25"
# 33 members: over the W3C bound, which the propagator drops whole
TOO_MANY = ",".join(f"k{n}=v" for n in range(33))


def _submitted(
    redis_client: redis.Redis, redis_url: str, tracestates: list[str | None]
) -> list[dict[bytes, bytes]]:
    """The stream entries of one job submitted per tracestate header (None: no header) to an
    instrumented producer, as Valkey holds them."""
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="r27-ts"))
    FastAPIInstrumentor.instrument_app(app)
    with TestClient(app, base_url="http://localhost") as client:
        for tracestate in tracestates:
            headers = {"traceparent": TRACEPARENT}
            if tracestate is not None:
                headers["tracestate"] = tracestate
            body = {"model": "identity", "inputs": {"x": 1}}
            answer = client.post("/v1/jobs", json=body, headers=headers)
            assert answer.status_code == 202, answer.text
    entries = redis_client.xrange(Keys().queue("identity", "default"))
    return [fields for _, fields in cast(list[tuple[bytes, dict[bytes, bytes]]], entries)]


def test_the_clients_tracestate_reaches_the_workers_span_context(
    spans: InMemorySpanExporter, redis_client: redis.Redis, redis_url: str
) -> None:
    carried, absent, dropped = _submitted(redis_client, redis_url, [TRACESTATE, None, TOO_MANY])
    assert carried[b"ts"] == TRACESTATE.encode()
    entry = RequestEntry.decode(carried)
    context = span_context_of(entry.traceparent, entry.tracestate)
    assert context is not None and context.trace_state.to_header() == TRACESTATE
    # no tracestate (or one the propagator dropped): the entry is no longer than before, and
    # reads as an older producer's entry does
    assert b"ts" not in absent and b"ts" not in dropped
    entry = RequestEntry.decode(absent)
    assert entry.tracestate == ""
    context = span_context_of(entry.traceparent, entry.tracestate)
    assert context is not None and len(context.trace_state) == 0


def test_a_tracestate_the_propagator_would_drop_is_not_written(
    spans: InMemorySpanExporter,
) -> None:
    """32 valid members can hold 16 KiB; a worker's extract keeps 8 KiB at most."""
    members = [(f"k{n}", "v" * 255) for n in range(32)]
    state = TraceState(members)
    assert len(state.to_header()) > TRACESTATE_MAX_CHARS
    parent = SpanContext(3, 12, is_remote=True, trace_flags=TraceFlags(1), trace_state=state)
    context = trace.set_span_in_context(NonRecordingSpan(parent))
    with trace.get_tracer("test").start_as_current_span("request", context=context):
        traceparent, tracestate = current_trace_context()
    assert traceparent and tracestate == ""
    extracted = span_context_of(traceparent, state.to_header())
    assert extracted is not None and len(extracted.trace_state) == 0


def test_the_workers_batch_span_carries_the_tracestate(spans: InMemorySpanExporter) -> None:
    """Its parent and its link to the request, as the worker builds them from the entry."""
    entry = RequestEntry("j", {"inputs": {}}, 0.0, traceparent=TRACEPARENT, tracestate=TRACESTATE)
    end_span(start_batch_span("m", "default", [Delivery(b"0-1", entry, "queued", 0)]))
    [span] = spans.get_finished_spans()
    assert span.parent is not None and span.parent.trace_state.to_header() == TRACESTATE
    assert [link.context.trace_state.to_header() for link in span.links] == [TRACESTATE]

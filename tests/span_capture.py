"""The spans a test's code opens, kept in memory: the `spans` fixture, which a test module
imports as `captured_spans`. One tracer provider serves the whole session: a module's tracer
(`trace.get_tracer` at import) binds to the first global provider it is used under and keeps it,
so a worker's spans went to whichever test's provider came first, and a later test with a
provider of its own saw none."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

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

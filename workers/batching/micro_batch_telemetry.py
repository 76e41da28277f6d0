"""What one micro-batch tells the outside: Prometheus observations, a span that links to every
request span it served (parent: the first request's, so a lone request reads as one trace),
and one JSON log line with the job ids and trace ids."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, Span

from shared.metrics import BATCH_SIZE, E2E_LATENCY, ENGINE_TIME, JOBS_FINISHED, QUEUE_WAIT
from shared.telemetry import span_context_of, trace_id_of
from workers.batching.micro_batch_executor import Outcome
from workers.partition.finish import Finish
from workers.partition.stream_reader import Delivery

log = logging.getLogger(__name__)
tracer = trace.get_tracer("conveyor.worker")


@contextmanager
def batch_span(model: str, variant: str, runnable: list[Delivery]) -> Iterator[Span]:
    contexts = [sc for d in runnable if d.entry and (sc := span_context_of(d.entry.traceparent))]
    parent = trace.set_span_in_context(NonRecordingSpan(contexts[0])) if contexts else None
    with tracer.start_as_current_span(
        f"batch {model}:{variant}",
        context=parent,
        links=[Link(sc) for sc in contexts],
        attributes={
            "conveyor.model": model,
            "conveyor.variant": variant,
            "conveyor.batch_size": len(runnable),
        },
    ) as span:
        yield span


def record_batch(model: str, variant: str, finishes: list[Finish], outcomes: list[Outcome]) -> None:
    partition = (model, variant)
    for finish in finishes:
        if not finish.status:
            continue
        JOBS_FINISHED.labels(*partition, finish.status).inc()
        created = int(finish.context["created"])
        if "started" in finish.context:
            QUEUE_WAIT.labels(*partition).observe((int(finish.context["started"]) - created) / 1e3)
        E2E_LATENCY.labels(*partition).observe((int(finish.fields["finished"]) - created) / 1e3)
    for outcome in {o.batch_id: o for o in outcomes}.values():
        ENGINE_TIME.labels(*partition).observe(outcome.engine_ms / 1e3)
        BATCH_SIZE.labels(*partition).observe(outcome.batch_size)


def log_batch(model: str, runnable: list[Delivery], outcomes: list[Outcome]) -> None:
    entries = [d.entry for d in runnable if d.entry is not None]
    log.info(
        "batch finished",
        extra={
            "model": model,
            "job_ids": [e.job_id for e in entries],
            "trace_ids": sorted({t for e in entries if (t := trace_id_of(e.traceparent))}),
            "failed": sum(1 for o in outcomes if o.error is not None),
        },
    )

"""What one micro-batch tells the outside: Prometheus observations, a span that links to every
request span it served (parent: the first request's, so a lone request reads as one trace) and
says which of its jobs failed, and one JSON log line with the job ids and trace ids."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache
from typing import Any, TypeVar, cast

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, Status, StatusCode
from prometheus_client import Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase

from shared.job_states import JobStatus
from shared.metrics import BATCH_SIZE, E2E_LATENCY, ENGINE_TIME, JOBS_FINISHED, QUEUE_WAIT
from shared.telemetry import span_context_of, trace_id_of, tracing_on
from workers.batching.micro_batch_executor import Outcome
from workers.partition.finish import Finish
from workers.partition.partition import Partition
from workers.partition.stream_reader import Delivery

log = logging.getLogger(__name__)
tracer = trace.get_tracer("conveyor.worker")


def start_batch_span(
    model: str, variant: str, runnable: list[Delivery], kind: str = "batch"
) -> Span | None:
    """A started span for a micro-batch, or one job's generation (`kind` "generate"), child of
    its first sampled request's span (else its first's) and linked to each; None while tracing
    is off (see `tracing_on`). The first's, unsampled, left a sampled request batched behind it
    without a worker span under a parent-based sampler: its trace ended at the producer.
    It is ended by `end_span`: a staged engine's micro-batch runs on in the stage pipeline
    after the loop has moved on, and its span lasts until its write-back."""
    if not tracing_on():
        return None
    contexts = [
        sc
        for d in runnable
        if d.entry and (sc := span_context_of(d.entry.traceparent, d.entry.tracestate))
    ]
    first = contexts[0] if contexts else None
    chosen = next((sc for sc in contexts if sc.trace_flags.sampled), first)
    parent = trace.set_span_in_context(NonRecordingSpan(chosen)) if chosen else None
    return tracer.start_span(
        f"{kind} {model}:{variant}",
        context=parent,
        links=[Link(sc) for sc in contexts],
        attributes={
            "conveyor.model": model,
            "conveyor.variant": variant,
            "conveyor.batch_size": len(runnable),
        },
    )


def current_span(span: Span | None) -> AbstractContextManager[Any]:
    """`span` as the current span (what raises inside is recorded on it), left open."""
    return trace.use_span(span, end_on_exit=False) if span is not None else nullcontext()


def end_span(span: Span | None) -> None:
    """End `span` if it is still open: a micro-batch's ends after its write-back, or where
    its run fails first, whichever comes first."""
    if span is not None and span.is_recording():
        span.end()


def record_failures(span: Span | None, runnable: list[Delivery], outcomes: list[Outcome]) -> None:
    """Each failed job of a micro-batch as an event on its span (job id, error type, message):
    the executor turns an engine's exception into its jobs' errors, so nothing raised marks
    the span. It is an error only when every job failed; a partly failed micro-batch served
    the others, so its status stays unset and its events say which jobs failed."""
    if span is None or not span.is_recording():
        return
    failed = [(d, o.error) for d, o in zip(runnable, outcomes, strict=True) if o.error is not None]
    for delivery, error in failed:
        attributes = {
            "conveyor.job_id": delivery.entry.job_id if delivery.entry else "",
            "exception.type": error.get("type", ""),
            "exception.message": error.get("message", ""),
        }
        span.add_event("job failed", attributes)
    if failed and len(failed) == len(outcomes):
        span.set_status(Status(StatusCode.ERROR, f"all {len(failed)} jobs failed"))


@contextmanager
def batch_span(
    model: str, variant: str, runnable: list[Delivery], kind: str = "batch"
) -> Iterator[None]:
    """`start_batch_span`'s span, current inside and ended on the way out."""
    span = start_batch_span(model, variant, runnable, kind)
    try:
        with current_span(span):
            yield
    finally:
        end_span(span)


def stage_span(name: str) -> AbstractContextManager[Any]:
    """A child of the batch span for one stage of it (decode, engine, write), when tracing."""
    return tracer.start_as_current_span(name) if tracing_on() else nullcontext()


M = TypeVar("M", Counter, Histogram)


@cache
def _labelled(metric: MetricWrapperBase, *labels: str) -> MetricWrapperBase:
    return metric.labels(*labels)


def _child(metric: M, *labels: str) -> M:
    """A metric's labelled child, looked up once: `labels()` locks and checks its arguments on
    every call, and a micro-batch makes five or more of them."""
    return cast(M, _labelled(metric, *labels))


def lane(partition: Partition, stream: str) -> str:
    """The `lane` label of one of the partition's streams."""
    return "bulk" if stream == partition.bulk else "online"


def record_batch(
    partition: Partition, stream: str, finishes: list[Finish], calls: list[Outcome]
) -> None:
    """The metrics of a write-back: its finished jobs' and its engine calls' (`engine_calls`)."""
    model, variant = partition.labels
    waits = (model, variant, lane(partition, stream))
    queue_wait, e2e = _child(QUEUE_WAIT, *waits), _child(E2E_LATENCY, *waits)
    for finish in finishes:
        if not finish.status:
            continue
        _child(JOBS_FINISHED, model, variant, finish.status).inc()
        created = int(finish.context["created"])
        if "queue_wait_ms" in finish.fields:
            queue_wait.observe(float(finish.fields["queue_wait_ms"]) / 1e3)
        # never below 0, as the queue wait: the end is stamped on the worker's clock, the submit
        # on the producer's, and a producer's clock ahead took from the histogram's `_sum`,
        # which `rate()` reads as a reset
        e2e.observe(max(0, int(finish.fields["finished"]) - created) / 1e3)
    engine_time = _child(ENGINE_TIME, model, variant)
    batch_size = _child(BATCH_SIZE, model, variant)
    for outcome in calls:
        engine_time.observe(outcome.engine_ms / 1e3)
        batch_size.observe(outcome.batch_size)


# What the API ends a queued job with: a cancel, or the end of its Batch API batch.
ENDED_BY_THE_API = frozenset({JobStatus.CANCELLED, JobStatus.EXPIRED})


def record_ended(partition: Partition, deliveries: Iterable[Delivery]) -> None:
    """Count the jobs the API ended while they were queued, read with that status: their
    entries are only acknowledged (`status` ''), so no written result counts them. Only jobs a
    worker had been handed when the API ended them reach here: the API withdraws any other
    entry, and JobStore counts that end. (One a blocking read handed over as queued runs, and
    FINISH, refusing its result, says the end it met: `finish.ended_as_finished` counts it.)"""
    for delivery in deliveries:
        if delivery.status in ENDED_BY_THE_API:
            _child(JOBS_FINISHED, *partition.labels, delivery.status).inc()


def log_batch(model: str, runnable: list[Delivery], written: list[Finish]) -> None:
    """One line per micro-batch: the jobs it ran, how many of them ended failed and how many
    its write-back did not write (cancelled meanwhile, taken over by another worker, gone).
    Counted from what the write-back wrote: from the engine's outcomes, a result too large for
    Redis (failed at the write) read as a success, and a job another worker took over as one
    this worker finished."""
    entries = [d.entry for d in runnable if d.entry is not None]
    statuses = {finish.job_id: finish.status for finish in written}
    ended = [statuses.get(e.job_id) for e in entries]
    log.info(
        "batch finished",
        extra={
            "model": model,
            "job_ids": [e.job_id for e in entries],
            "trace_ids": sorted({t for e in entries if (t := trace_id_of(e.traceparent))}),
            "failed": ended.count(JobStatus.FAILED),
            "not_written": ended.count(None),
        },
    )

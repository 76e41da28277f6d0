"""Tracing and structured logs shared by producer and workers. Tracing is off unless the
standard `OTEL_TRACES_EXPORTER` asks for exporters (`otlp`, `console`, or both); OTLP goes over
gRPC unless `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL` says
`http/protobuf`. The W3C `traceparent` of the producer's span travels in the stream entry so a
worker's batch span links to every request it served."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

from opentelemetry import trace
from opentelemetry.sdk.environment_variables import (
    OTEL_SPAN_EVENT_COUNT_LIMIT,
    OTEL_SPAN_LINK_COUNT_LIMIT,
)
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.orjson import OrjsonFormatter

from shared.model_repository import MAX_JOBS_PER_READ

_PROPAGATOR = TraceContextTextMapPropagator()
# The longest tracestate the propagator's extract keeps (OpenTelemetry's bound; W3C asks for
# at least 512 characters to be passed on).
TRACESTATE_MAX_CHARS = 8192
# What OTEL_TRACES_EXPORTER and the OTLP protocol variables may say here.
EXPORTERS = "otlp, console or none"
PROTOCOLS = "grpc or http/protobuf"
# A micro-batch's span has a link per job and an event per failed job: the SDK's default of 128
# each kept a batch's last 128, so the others' traces (its parent's among them) lost the link.
_PER_JOB_LIMITS = {
    OTEL_SPAN_LINK_COUNT_LIMIT: "max_links",
    OTEL_SPAN_EVENT_COUNT_LIMIT: "max_events",
}


def configure_tracing(service_name: str) -> bool:
    """Install an SDK tracer provider with the exporters OTEL_* names; False when tracing is off.
    A name or protocol it cannot export with ends the process in one line naming the variable:
    anything but `console` was taken for gRPC OTLP, which exported nowhere (an HTTP port).
    OTEL_SDK_DISABLED=true turns it off too: the SDK's provider then makes no-op spans only,
    at the cost `tracing_on` saves."""
    names = _exporter_names()
    if not names or _sdk_disabled():
        return False
    exporters = [_exporter(name) for name in names]
    provider = TracerProvider(resource=_resource(service_name), span_limits=_span_limits())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


def _sdk_disabled() -> bool:
    """OTEL_SDK_DISABLED, read as the SDK reads it."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def _resource(service_name: str) -> Resource:
    """The standard variables' resource, `service_name` only where neither OTEL_SERVICE_NAME
    nor OTEL_RESOURCE_ATTRIBUTES names the service: laid over them, it hid the latter's
    `service.name`, and an empty OTEL_SERVICE_NAME (unset, to the spec) named the service
    `unknown_service`."""
    named = OTELResourceDetector().detect().attributes.get(SERVICE_NAME)
    return Resource.create({} if named else {SERVICE_NAME: service_name})


def _span_limits() -> SpanLimits:
    """The SDK's limits, but room for every job of the largest micro-batch where the standard
    variables set no link or event count limit."""
    unset = [arg for variable, arg in _PER_JOB_LIMITS.items() if not os.environ.get(variable)]
    return SpanLimits(**dict.fromkeys(unset, MAX_JOBS_PER_READ))


def _exporter_names() -> list[str]:
    """OTEL_TRACES_EXPORTER's list (`otlp,console`: both), `none` left out."""
    setting = os.environ.get("OTEL_TRACES_EXPORTER", "none")
    names = [n for part in setting.split(",") if (n := part.strip().lower()) not in ("", "none")]
    if unknown := [n for n in names if n not in ("otlp", "console")]:
        _refuse("OTEL_TRACES_EXPORTER", setting, f"no exporter {', '.join(unknown)}", EXPORTERS)
    return names


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if _otlp_protocol() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as OTLPHttpSpanExporter,
    )

    return OTLPHttpSpanExporter()


def _otlp_protocol() -> str:
    """The OTLP transport for traces, the traces' own variable first, as the spec orders them."""
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        if setting := os.environ.get(variable, "").strip():
            if setting.lower() not in ("grpc", "http/protobuf"):
                _refuse(variable, setting, "not a protocol this build exports with", PROTOCOLS)
            return setting.lower()
    return "grpc"


def _refuse(variable: str, setting: str, why: str, choices: str) -> NoReturn:
    raise SystemExit(f"Error: {variable}={setting}: {why} (it takes {choices})")


def tracing_on() -> bool:
    """Whether a tracer provider is installed (`configure_tracing`, or a test's). Without one,
    OpenTelemetry's no-op spans still cost their contexts and context managers: a fifth of a
    lone job's worker CPU went to four of them per micro-batch (benchmark part A, concurrency 1)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def current_trace_context() -> tuple[str, str]:
    """The active span's W3C traceparent and tracestate ('' each when absent), from one inject:
    the tracestate is a client's vendor data (sampling, routing) for the worker's span too. One
    longer than the propagator's extract keeps is '' here: the worker would drop it anyway,
    and it would only grow the stream entry (a span context holds at most 32 members, but of
    up to 16 KiB)."""
    if not tracing_on():
        return "", ""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    tracestate = carrier.get("tracestate", "")
    kept = tracestate if len(tracestate) <= TRACESTATE_MAX_CHARS else ""
    return carrier.get("traceparent", ""), kept


def span_context_of(traceparent: str, tracestate: str = "") -> trace.SpanContext | None:
    """The remote span context a stream entry names, its tracestate with it (the members the
    propagator keeps: a header over 32 members, 8192 characters or with an invalid member is
    dropped whole)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    ctx = _PROPAGATOR.extract(carrier)
    span_context = trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None


def trace_id_of(traceparent: str) -> str:
    span_context = span_context_of(traceparent)
    return format(span_context.trace_id, "032x") if span_context else ""


class _TraceFields(logging.Filter):
    """Stamp every record with the current trace id, so logs and traces join up."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "trace_id"):
            record.trace_id = _open_trace_id()
        return True


def _open_trace_id() -> str:
    """The trace id of the current span while it is open ('' when none is). A task made under
    a request keeps that request's context for good (the producer's reply listener, made for
    its first waiter): its lines named the ended request's trace for as long as it ran."""
    span = trace.get_current_span()
    if isinstance(span, ReadableSpan) and span.end_time is not None:
        return ""
    span_context = span.get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else ""


def configure_logging(level: str) -> None:
    """One JSON object per line on stderr, with job ids (passed as `extra`) and trace ids,
    encoded by orjson: a worker logs a line per micro-batch, and the standard encoder made it
    a fifth dearer."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        OrjsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "asctime": "time"},
            reserved_attrs=[*RESERVED_ATTRS, "color_message"],  # uvicorn's, with ANSI escapes
        )
    )
    handler.addFilter(_TraceFields())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _OWN_HANDLERS:
        _through_root(logging.getLogger(name))
    # its INFO line per request names the URL in full: a webhook's credential (its path, its
    # query), which the delivery's own lines leave out
    logging.getLogger("httpx").setLevel(logging.WARNING)


# Loggers a server gives plain-text handlers of their own, passing nothing up: uvicorn's (its
# errors' tracebacks among them; `uvicorn.error` goes through `uvicorn`) and its access log.
_OWN_HANDLERS = ("uvicorn", "uvicorn.access")


def _through_root(logger: logging.Logger) -> None:
    """`logger`'s records to the root's JSON handler rather than its own. One without handlers
    stays silent: uvicorn turns its access log off so (`access_log=False`), and checks
    `hasHandlers()`, which the root's would answer."""
    if logger.handlers:
        logger.handlers.clear()
        logger.propagate = True

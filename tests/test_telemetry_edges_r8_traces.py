"""What tracing names a service, when it is off, and which trace a log line joins: the
standard resource variables as the OpenTelemetry spec orders them, OTEL_SDK_DISABLED, and a
log line of a task that outlived the request it was started under, which named that request's
trace."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import TextIO, cast

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from shared.telemetry import configure_logging, configure_tracing, tracing_on
from tests.span_capture import captured_spans  # noqa: F401 (`spans`)

log = logging.getLogger("conveyor.test.telemetry")


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Room for `configure_tracing` to install its provider, taken away again after the test:
    OpenTelemetry lets a process set its global provider once."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    yield
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


def _service_name() -> object:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    return provider.resource.attributes["service.name"]


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=edge-a,team=ml"}, "edge-a"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=edge-a", "OTEL_SERVICE_NAME": "b"}, "b"),
        ({"OTEL_SERVICE_NAME": ""}, "conveyor-producer"),
        ({}, "conveyor-producer"),
    ],
)
def test_the_service_name_follows_the_standard_variables(
    installed: None, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str
) -> None:
    """`service.name` in OTEL_RESOURCE_ATTRIBUTES was overridden by Conveyor's default name,
    and an empty OTEL_SERVICE_NAME (unset, to the spec) named the service `unknown_service`."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert configure_tracing("conveyor-producer")
    assert _service_name() == named


@pytest.fixture
def json_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """What `configure_logging`'s handler writes; the loggers it sets up are the session's
    again after the test."""
    touched = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.access", "httpx")]
    levels = [logger.level for logger in touched]
    for logger in touched:
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "propagate", logger.propagate)
    configure_logging("INFO")
    written = io.StringIO()
    cast(logging.StreamHandler[TextIO], touched[0].handlers[0]).setStream(written)
    yield written
    for logger, level in zip(touched, levels, strict=True):
        logger.setLevel(level)


def _trace_ids(written: io.StringIO) -> dict[str, str]:
    """message → trace_id of this module's JSON lines."""
    lines = [json.loads(line) for line in written.getvalue().splitlines()]
    return {line["message"]: line["trace_id"] for line in lines if line["name"] == log.name}


def test_a_task_that_outlives_its_request_logs_no_trace_id(
    json_logs: io.StringIO, spans: InMemorySpanExporter
) -> None:
    """A long-lived task made under a request (the reply listener, on its first waiter) keeps
    that request's context: every line it logged after the request ended named that trace."""

    async def requests() -> str:
        woken = asyncio.Event()

        async def listener() -> None:
            log.warning("listening")
            await woken.wait()
            log.warning("long after")

        with trace.get_tracer(__name__).start_as_current_span("POST /v1/jobs") as request:
            task = asyncio.create_task(listener())
            await asyncio.sleep(0)
            log.warning("in the request")
        woken.set()
        await task
        return format(request.get_span_context().trace_id, "032x")

    trace_id = asyncio.run(requests())
    assert _trace_ids(json_logs) == {
        "listening": trace_id,
        "in the request": trace_id,
        "long after": "",
    }


def test_a_disabled_sdk_installs_no_tracing(
    installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OTEL_SDK_DISABLED=true beside an exporter: the SDK's provider made only no-op spans,
    which still cost what no provider at all saves (`tracing_on`), and the producer still ran
    OpenTelemetry's middleware on every request."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not configure_tracing("conveyor-producer")
    assert not tracing_on()

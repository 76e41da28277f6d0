"""The producer's long-lived tasks start in a context of their own, not in the one they were
made in: the reply listener's (made at start-up, or by the first request that follows a
channel) and a group commit's flush (made in the turn of the request whose command came first)
inherited that context, so a span opened in them was parented to that old request and their log
lines carried its trace id. The real producer app on a real Valkey, the real OpenTelemetry SDK;
a task factory notes the span current where each task starts."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client
from tests.span_capture import captured_spans  # noqa: F401 (`spans`)

tracer = trace.get_tracer(__name__)


@contextmanager
def task_trace_ids() -> Iterator[dict[str, set[int]]]:
    """The trace ids current where this loop's tasks start, by their coroutine's name."""
    seen: dict[str, set[int]] = {}

    def factory(
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any],
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        context = context if context is not None else contextvars.copy_context()
        span = context.run(trace.get_current_span)
        seen.setdefault(getattr(coro, "__qualname__", ""), set()).add(
            span.get_span_context().trace_id
        )
        return asyncio.Task(coro, loop=loop, context=context)

    loop = asyncio.get_running_loop()
    loop.set_task_factory(factory)  # type: ignore[arg-type]
    try:
        yield seen
    finally:
        loop.set_task_factory(None)


async def test_the_reply_listener_and_a_flush_start_outside_their_makers_trace(
    redis_url: str, spans: InMemorySpanExporter
) -> None:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="task-context")
    with task_trace_ids() as seen, tracer.start_as_current_span("request") as request:
        async with app_client(create_app(settings)) as client:
            submitted = await client.post("/v1/jobs", json={"model": "identity", "inputs": {}})
            assert submitted.status_code in (200, 201, 202), submitted.text
    made_in = request.get_span_context().trace_id
    listen = seen["ReplyListener._listen"]
    flushes = set().union(*(ids for name, ids in seen.items() if name.endswith("._send")))
    assert listen and flushes
    assert made_in not in listen | flushes, seen

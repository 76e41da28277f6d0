"""A failed job marks its worker span. The micro-batch executor turns an engine's exception
into its jobs' errors, so nothing raised through the batch span: a micro-batch whose every job
failed read in Jaeger as a success, with no word of the failure. Its span now has an event per
failed job and, when all failed, status ERROR; a generation's span is ERROR when its job failed.
The producer and a worker runtime in this process, on a real Valkey, the real SDK."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from shared.codec import RequestEntry
from shared.settings import Settings
from tests.conftest import REPO_ROOT
from tests.span_capture import captured_spans, predict_in_process  # noqa: F401 (`spans`)
from workers.batching.micro_batch_executor import Outcome
from workers.batching.micro_batch_telemetry import end_span, record_failures, start_batch_span
from workers.partition.stream_reader import Delivery

SAMPLED = "00-" + "2" * 32 + "-" + "b" * 16 + "-01"


def failed_predict(
    spans: InMemorySpanExporter, settings: Settings, model: str, body: dict[str, Any]
) -> tuple[str, Sequence[ReadableSpan]]:
    """One predict of `model` that fails its job: its error's message (which names the job),
    and every span finished then."""
    answer = predict_in_process(settings, model, body)
    assert answer.status_code >= 400, answer.text
    return answer.json()["error"]["message"], spans.get_finished_spans()


def test_a_micro_batch_whose_jobs_all_failed_is_an_error_with_each_failure_an_event(
    redis_url: str, spans: InMemorySpanExporter
) -> None:
    settings = Settings(
        redis_url=redis_url,
        key_prefix="trace-failed:",
        model_repository=REPO_ROOT / "tests/fixtures/model_repository",
        models=["faulty:default"],
        auth="disabled",
    )
    body = {"inputs": {"action": "raise", "tag": "t"}}
    message, finished = failed_predict(spans, settings, "faulty", body)
    [batch] = [s for s in finished if s.name == "batch faulty:default"]
    assert batch.status.status_code is StatusCode.ERROR
    [event] = [e for e in batch.events if e.name == "job failed"]
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert "poison item" in str(event.attributes["exception.message"])
    assert message.startswith(f"job {event.attributes['conveyor.job_id']!s} failed")


def test_a_partly_failed_micro_batch_names_its_failed_job_and_is_no_error(
    spans: InMemorySpanExporter,
) -> None:
    batch = [_delivery("served"), _delivery("poisoned")]
    error = {"type": "ValueError", "message": "poison item"}
    span = start_batch_span("m", "default", batch)
    record_failures(span, batch, [_outcome(None), _outcome(error)])
    end_span(span)
    [finished] = spans.get_finished_spans()
    assert finished.status.status_code is StatusCode.UNSET
    assert [dict(e.attributes or {}) for e in finished.events] == [
        {
            "conveyor.job_id": "poisoned",
            "exception.type": "ValueError",
            "exception.message": "poison item",
        }
    ]


def _delivery(job_id: str) -> Delivery:
    entry = RequestEntry(job_id, {"inputs": {}}, 0.0, traceparent=SAMPLED)
    return Delivery(job_id.encode(), entry, "queued", 0)


def _outcome(error: dict[str, str] | None) -> Outcome:
    return Outcome({} if error is None else None, error, 1.0, 2, "b", 0.0)


def test_a_failed_generation_span_is_an_error(redis_url: str, spans: InMemorySpanExporter) -> None:
    settings = Settings(
        redis_url=redis_url,
        key_prefix="trace-gen-failed:",
        model_repository=REPO_ROOT / "tests/fixtures/paced_repository",
        models=["paced:default"],
        auth="disabled",
    )
    body = {"inputs": {"prompt": "<bytes>"}, "parameters": {"max_tokens": 1}}
    _, finished = failed_predict(spans, settings, "paced", body)
    [generation] = [s for s in finished if s.name == "generate paced:default"]
    assert generation.status.status_code is StatusCode.ERROR

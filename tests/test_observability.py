"""Metrics that match a known workload exactly, a trace that joins the producer's request span
to the worker's batch span, and JSON log lines carrying job and trace ids."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from conveyor.stack import Stack
from producer_api.app import UNTRACED, create_app
from shared.keys import Keys
from shared.settings import Settings
from shared.telemetry import current_traceparent, tracing_on
from tests.conftest import running_stack, until
from workers.batching.micro_batch_telemetry import stage_span
from workers.runtime.consumer_runtime import ConsumerRuntime

KEYS = Keys("cv:")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=10).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_match_a_known_workload(
    stack: Stack, base_url: str, identity_worker: int, stack_redis: redis.Redis
) -> None:
    worker_url = f"http://127.0.0.1:{stack.metrics_ports['identity-default']}/metrics"
    part = {"model": "identity", "variant": "default"}
    before_p, before_w = scrape(f"{base_url}/metrics"), scrape(worker_url)
    ids = []
    for i in range(10):
        response = httpx.post(
            f"{base_url}/v1/models/identity/predict", json={"inputs": {"i": i}}, timeout=30
        )
        ids.append(response.json()["id"])
    canary = [
        httpx.post(
            f"{base_url}/v1/jobs",
            json={"model": "identity", "variant": "canary", "inputs": {}},
            timeout=10,
        ).json()["id"]
        for _ in range(3)
    ]
    after_p, after_w = scrape(f"{base_url}/metrics"), scrape(worker_url)

    def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta(after_p, before_p, "conveyor_jobs_submitted_total", **part, lane="online") == 10
    assert delta(after_w, before_w, "conveyor_jobs_finished_total", **part, state="succeeded") == 10
    assert delta(after_w, before_w, "conveyor_queue_wait_seconds_count", **part) == 10
    assert delta(after_w, before_w, "conveyor_e2e_latency_seconds_count", **part) == 10
    batches = {stack_redis.hget(KEYS.job(i), "batch_id") for i in ids}
    assert delta(after_w, before_w, "conveyor_batch_size_count", **part) == len(batches)
    assert delta(after_w, before_w, "conveyor_batch_size_sum", **part) == 10
    route = {"method": "POST", "route": "/v1/models/{model}/predict", "status": "200"}
    assert delta(after_p, before_p, "conveyor_http_requests_total", **route) == 10
    canary_lane = {"model": "identity", "variant": "canary", "lane": "online"}
    queued = stack_redis.xlen(KEYS.queue("identity", "canary"))
    assert queued >= 3

    # Partition gauges are refreshed at most once a second, so a scrape right after the
    # submits may still show the previous refresh; the next ones must catch up.
    def refreshed() -> Samples | None:
        samples = scrape(f"{base_url}/metrics")
        lag = value(samples, "conveyor_partition_lag", **canary_lane)
        return samples if lag == queued else None

    fresh = until(refreshed)
    assert value(fresh, "conveyor_oldest_queued_age_seconds", **canary_lane) > 0
    for job_id in canary:
        httpx.delete(f"{base_url}/v1/jobs/{job_id}", timeout=10)


def test_worker_logs_are_json_with_job_ids(stack: Stack, identity_worker: int) -> None:
    job = httpx.post(
        f"{stack.base_url}/v1/models/identity/predict", json={"inputs": {"log": 1}}, timeout=30
    ).json()

    def batch_events() -> list[dict[str, Any]] | None:
        """The worker's "batch finished" lines, once the one for this job is written (the
        reply is published before the worker logs the micro-batch)."""
        lines = (stack.log_dir / "identity-default.log").read_text().splitlines()
        events = [json.loads(line) for line in lines if line.startswith("{")]
        batches = [e for e in events if e.get("message") == "batch finished"]
        return batches if any(job["id"] in e["job_ids"] for e in batches) else None

    logged: list[dict[str, Any]] = until(batch_events, timeout=10)
    assert all({"time", "level", "name", "trace_id"} <= e.keys() for e in logged)


def test_a_worker_logs_at_conveyor_log_level_not_celerys(tmp_path: Path) -> None:
    """CONVEYOR_LOG_LEVEL=WARNING leaves out the worker's per-micro-batch lines, although its
    command line says `--loglevel=INFO`, as `conveyor.stack`'s does (Celery used to set the
    root logger to that; the manifests no longer pass one)."""
    with running_stack(tmp_path, CONVEYOR_AUTH="disabled", CONVEYOR_LOG_LEVEL="WARNING") as quiet:
        quiet.start_worker("identity:default")
        url = f"{quiet.base_url}/v1/models/identity/predict"
        for n in range(3):
            response = httpx.post(url, json={"inputs": {"n": n}}, timeout=30)
            assert response.status_code == 200, response.text
        quiet.stop_process("identity-default")  # a warm shutdown: whatever it logs is written
        logged = (quiet.log_dir / "identity-default.log").read_text()
    assert "batch finished" not in logged  # test_worker_logs_are_json_with_job_ids: at INFO


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace._TRACER_PROVIDER = None  # a fresh global provider for this test only
    trace._TRACER_PROVIDER_SET_ONCE._done = False
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()


def test_request_span_links_to_worker_batch_span(
    redis_url: str, spans: InMemorySpanExporter
) -> None:
    settings = Settings(
        redis_url=redis_url, key_prefix="trace:", models=["identity:default"], auth="disabled"
    )
    runtime = ConsumerRuntime(settings)
    runtime.start()
    app = create_app(settings)
    FastAPIInstrumentor.instrument_app(app)
    try:
        with TestClient(app) as client:
            response = client.post("/v1/models/identity/predict", json={"inputs": {"t": 1}})
            assert response.status_code == 200
    finally:
        runtime.stop()
    finished = spans.get_finished_spans()
    server = next(s for s in finished if s.name == "POST /v1/models/{model}/predict")
    batch = next(s for s in finished if s.name == "batch identity:default")
    assert batch.context.trace_id == server.context.trace_id
    assert [link.context.span_id for link in batch.links] == [server.context.span_id]
    children = {s.name for s in finished if s.parent and s.parent.span_id == batch.context.span_id}
    assert {"decode", "engine", "write"} <= children


def test_probes_go_untraced_and_requests_to_a_host_named_metrics_do_not(
    spans: InMemorySpanExporter,
) -> None:
    """OpenTelemetry matches its exclusions anywhere in the URL, Host included: "metrics" left
    every request to a producer served as metrics.example.com without a span."""
    app = create_app(Settings(auth="disabled"))
    FastAPIInstrumentor.instrument_app(app, excluded_urls=UNTRACED)
    # no lifespan (no Redis): the model's route fails, as traced as any other answer
    client = TestClient(app, base_url="http://metrics.example.com", raise_server_exceptions=False)
    for path in ("/healthz", "/readyz", "/metrics", "/v1/models/text-metrics"):
        client.get(path)
    traced = [s.name for s in spans.get_finished_spans() if s.kind == trace.SpanKind.SERVER]
    assert traced == ["GET /v1/models/{model}"], traced


def test_without_a_tracer_provider_the_batch_loop_opens_no_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tracing off (no `OTEL_TRACES_EXPORTER`): no span at all, not even OpenTelemetry's no-op
    ones, whose contexts cost a fifth of a lone job's worker CPU; with a provider, real spans."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    assert not tracing_on()
    assert isinstance(stage_span("engine"), nullcontext)
    assert current_traceparent() == ""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider())
    assert tracing_on()
    with stage_span("engine") as span:
        assert span.is_recording()

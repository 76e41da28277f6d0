"""Metrics that match a known workload exactly, a trace that joins the producer's request span
to the worker's batch span, and JSON log lines carrying job and trace ids."""

from __future__ import annotations

import json
import re
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from conveyor.stack import Stack, free_port
from producer_api.app import UNTRACED, create_app
from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig, QueueLimits
from shared.settings import Settings
from shared.telemetry import current_trace_context, tracing_on
from tests.conftest import running_stack, until
from tests.paced_engine import PacedEngine
from tests.span_capture import PROVIDER, captured_spans, traced_predict  # noqa: F401 (`spans`)
from tests.test_compose import alert_rules, dashboard, dashboard_exprs, target_labels
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.batching.micro_batch_telemetry import stage_span
from workers.engines.identity_engine import IdentityEngine
from workers.generation.generate_loop import GenerateLoop
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader
from workers.partition.token_writer import TokenWriter

KEYS = Keys("cv:")
ENDED_KEYS = Keys("ended:")

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
    assert (
        delta(after_w, before_w, "conveyor_queue_wait_seconds_count", **part, lane="online") == 10
    )
    assert (
        delta(after_w, before_w, "conveyor_e2e_latency_seconds_count", **part, lane="online") == 10
    )
    # a wait as long as a queue lets a job wait reads as itself, not as the top bucket's bound
    for wait in ("conveyor_queue_wait_seconds_bucket", "conveyor_e2e_latency_seconds_bucket"):
        bounds = [float(dict(labels)["le"]) for name, labels in after_w if name == wait]
        assert max(b for b in bounds if b != float("inf")) >= QueueLimits().max_queue_time_s
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


def test_the_producer_logs_uvicorns_lines_as_json_too(stack: Stack) -> None:
    """uvicorn gives its loggers a plain-text handler of their own: its "Exception in ASGI
    application" traceback, the line an operator most needs, was the one a JSON log pipeline
    could not parse, without a trace id. (Under uvicorn's command line: the deployments' server
    passes uvicorn its socket, and uvicorn then logs no "running on" line.)"""
    name = "producer-uvicorn-log"
    stack.start_producer(free_port(), name=name, server="uvicorn")
    stack.stop_process(name)
    lines = (stack.log_dir / f"{name}.log").read_text().splitlines()
    running = json.loads(next(line for line in lines if "Uvicorn running on" in line))
    assert running["name"] == "uvicorn.error" and "trace_id" in running
    assert "color_message" not in running  # its copy of the message with terminal colours


def test_conveyor_ups_producer_logs_json_from_its_first_line(stack: Stack) -> None:
    """`conveyor up`'s producer server (conveyor/producer_server.py) let uvicorn configure
    logging: "Started server process" and "Waiting for application startup" were plain text."""
    lines = (stack.log_dir / "producer.log").read_text().splitlines()
    started = [json.loads(line) for line in lines if "Started server process" in line]
    assert [line["name"] for line in started] == ["uvicorn.error"], lines[:3]


def test_a_worker_logs_at_conveyor_log_level_not_celerys(tmp_path: Path) -> None:
    """CONVEYOR_LOG_LEVEL=WARNING leaves out the worker's per-micro-batch lines, although its
    command line says `--loglevel=INFO`, as `conveyor.stack`'s does (Celery used to set the
    root logger to that; the manifests no longer pass one)."""
    with running_stack(
        tmp_path,
        CONVEYOR_AUTH="disabled",
        CONVEYOR_LOG_LEVEL="WARNING",
        workers=("identity:default",),
    ) as quiet:
        url = f"{quiet.base_url}/v1/models/identity/predict"
        for n in range(3):
            response = httpx.post(url, json={"inputs": {"n": n}}, timeout=30)
            assert response.status_code == 200, response.text
        quiet.stop_process("identity-default")  # a warm shutdown: whatever it logs is written
        logged = (quiet.log_dir / "identity-default.log").read_text()
    assert "batch finished" not in logged  # test_worker_logs_are_json_with_job_ids: at INFO


def test_request_span_links_to_worker_batch_span(
    redis_url: str, spans: InMemorySpanExporter
) -> None:
    settings = Settings(
        redis_url=redis_url, key_prefix="trace:", models=["identity:default"], auth="disabled"
    )
    server, finished = traced_predict(spans, settings, "identity", {"inputs": {"t": 1}})
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
    app = create_app(Settings(auth="disabled", allowed_hosts="metrics.example.com"))
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
    assert current_trace_context() == ("", "")
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", PROVIDER)  # the one the tracers bind to
    assert tracing_on()
    with stage_span("engine") as span:
        assert span.is_recording()


def _finished(model: str, state: str) -> float:
    labels = {"model": model, "variant": "default", "state": state}
    return REGISTRY.get_sample_value("conveyor_jobs_finished_total", labels) or 0.0


async def _queued_then_ended(aredis: aioredis.Redis, partition: Partition) -> JobStore:
    """Three bulk jobs: one the API cancels and one a Batch API batch expires while they wait,
    and one that runs."""
    store = JobStore(aredis, ENDED_KEYS, ttl_s=60)
    for job_id in ("cancelled", "expired", "kept"):
        entry = RequestEntry(job_id, {"inputs": {}, "prompt": "a b"}, now_ms())
        fields = {"model": partition.config.name, "variant": partition.variant}
        await store.create(entry, partition.bulk, fields)
    await store.transition("cancelled", JobStatus.CANCELLED)
    await store.settle_many(["expired"], JobStatus.EXPIRED, {})
    return store


async def test_jobs_the_api_ended_while_queued_count_as_finished(aredis: aioredis.Redis) -> None:
    """No FINISH reports them, and `{state="cancelled"}` stayed 0 for batch models: they count
    once each, where their entries are withdrawn (or, handed to a worker before they ended, as
    it reads them with their status). The job that ran counts its queue wait under its lane."""
    config = ModelConfig(name="ended-batch", kind="batch", backend="identity")
    partition = Partition.of(ENDED_KEYS, config, "default")
    states = ("cancelled", "expired", "succeeded")
    before = [_finished("ended-batch", state) for state in states]
    await _queued_then_ended(aredis, partition)
    events = JobEvents("redis://unused")
    reader = StreamReader(aredis, ENDED_KEYS, partition.streams, "w-1")
    await reader.ensure_groups()
    reclaimer = Reclaimer(aredis, ENDED_KEYS, partition, "w-1", 60, events)
    writer = ResultWriter(aredis, ENDED_KEYS, 60, events, "w-1")
    engine = IdentityEngine(config, "default", "")
    loop = MicroBatchLoop(
        partition, LaneScheduler(partition, reader, reclaimer), reader, writer, engine, 100
    )
    wait = {"model": "ended-batch", "variant": "default", "lane": "bulk"}
    waits = REGISTRY.get_sample_value("conveyor_queue_wait_seconds_count", wait) or 0.0

    batch = await reader.take([partition.bulk], 10)  # under load: read with their statuses
    assert batch is not None
    await loop.process(*batch)
    await writer.close()

    assert [_finished("ended-batch", s) - b for s, b in zip(states, before, strict=True)] == [
        1,
        1,
        1,
    ]
    assert REGISTRY.get_sample_value("conveyor_queue_wait_seconds_count", wait) == waits + 1


async def test_a_generate_loop_counts_jobs_the_api_ended_while_queued(
    aredis: aioredis.Redis,
) -> None:
    config = ModelConfig(
        name="ended-gen", kind="generate", backend="tests.paced_engine:PacedEngine"
    )
    partition = Partition.of(ENDED_KEYS, config, "default")
    before = [_finished("ended-gen", state) for state in ("cancelled", "expired")]
    await _queued_then_ended(aredis, partition)
    events = JobEvents("redis://unused")
    reader = StreamReader(aredis, ENDED_KEYS, partition.streams, "w-2", mark_on_read=True)
    await reader.ensure_groups()
    reclaimer = Reclaimer(aredis, ENDED_KEYS, partition, "w-2", 60, events)
    engine = PacedEngine(config, "default", "")
    await engine.load()
    loop = GenerateLoop(
        partition,
        LaneScheduler(partition, reader, reclaimer),
        reader,
        ResultWriter(aredis, ENDED_KEYS, 60, events, "w-2"),
        TokenWriter(aredis, ENDED_KEYS, 60),
        engine,
        block_ms=50,
        drain_s=1,
    )

    batch = await reader.take([partition.bulk], 10)
    assert batch is not None
    await loop._start_all(*batch)

    assert list(loop.running) == ["kept"]
    after = [_finished("ended-gen", state) for state in ("cancelled", "expired")]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
    await loop._drain()


def _exported(*urls: str) -> dict[str, set[str] | None]:
    """Sample name → its label names, as Prometheus stores scrapes of `urls`; None for a family
    registered but observed nowhere (its TYPE gives its names, no sample its labels)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    found: dict[str, set[str] | None] = {}
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
            for name in (family.name + s for s in suffixes.get(family.type, ())):
                found.setdefault(name, None)
            for sample in family.samples:
                found[sample.name] = (found.get(sample.name) or set()) | sample.labels.keys()
    return found


def _labels_queried(query: str) -> set[str]:
    """The labels a PromQL query groups by, matches on, or (`label_values`) lists."""
    grouped = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", query)
    names = {name.strip() for group in grouped for name in group.split(",")}
    names |= set(re.findall(r"[{,]\s*(\w+)\s*(?:=~|!~|!=|=)", query))
    names |= set(re.findall(r"label_values\([^,]*,\s*(\w+)\)", query))
    return names - {""}


def test_every_dashboard_and_alert_query_names_series_the_processes_export(
    stack: Stack, base_url: str, identity_worker: int
) -> None:
    """Each metric a panel, variable or alert queries is on a real producer's or worker's /metrics,
    with its type's suffix and every label the query names but Prometheus's target labels
    (where the scrape holds samples of it): a renamed family or label leaves a panel empty,
    never an error."""
    httpx.post(f"{base_url}/v1/models/identity/predict", json={"inputs": {}}, timeout=30)
    worker = f"http://127.0.0.1:{stack.metrics_ports['identity-default']}/metrics"
    exported = _exported(f"{base_url}/metrics", worker)
    queries = [e for group in dashboard_exprs().values() for e in group]
    queries += [v["definition"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    queries += [rule["expr"] for rule in alert_rules()]
    wrong = []
    for query in queries:
        labels = _labels_queried(query) - target_labels()
        for name in re.findall(r"\bconveyor_\w+", query):
            if name not in exported:
                wrong.append(f"{name} is not exported ({query})")
            elif (has := exported[name]) is not None and not labels <= has:
                wrong.append(f"{name} has only {sorted(has)} ({query})")
    assert wrong == []

"""The pipeline end to end on the CPU: real producer and Celery worker processes, a real
embedded Valkey, the real identity and minilm models."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from conveyor.stack import Stack
from shared.codec import loads
from shared.keys import Keys
from tests.conftest import until
from tests.minilm_reference import reference_embeddings

KEYS = Keys("cv:")

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "",
    "A queue in front of a model lets bursts wait instead of failing.",
    "Paris is the capital of France.",
    "Ünïcödé tëxt with äccents and emoji 🚀",
    "short",
    "Embeddings map sentences to vectors so that similar meanings lie close together.",
    "1234567890",
    "SELECT * FROM jobs WHERE status = 'queued';",
    "   leading and trailing spaces   ",
    "The cat sat on the mat. " * 3,
    "word " * 600,
]


def _submit(base_url: str, body: dict[str, Any], **params: Any) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/jobs", json=body, params=params, timeout=60)


def _job_hash(stack_redis: redis.Redis, job_id: str) -> dict[str, str]:
    fields: dict[str, str] = stack_redis.hgetall(KEYS.job(job_id))  # type: ignore[assignment]
    return fields


def test_identity_submit_then_poll(base_url: str, identity_worker: int) -> None:
    accepted = _submit(base_url, {"model": "identity", "inputs": {"x": [1, 2, 3]}})
    assert accepted.status_code == 202
    body = accepted.json()
    assert body["status"] == "queued" and body["variant"] == "default"
    job = httpx.get(body["urls"]["self"], params={"wait": 30}, timeout=60).json()
    assert job["status"] == "succeeded"
    assert job["outputs"] == {"x": [1, 2, 3]}
    assert job["timings"]["queue_wait_ms"] >= 0 and job["batch_size"] >= 1


def test_queue_waits_are_timed_to_the_microsecond(base_url: str, identity_worker: int) -> None:
    """A GPU's micro-batch takes a fraction of a ms: a queue wait counted in whole ms would
    read 0 or 1 there. Waits are to the µs (three decimals), not whole ms, and within the job's
    own span from created to finished, with the engine's time: `total_ms` runs between whole
    ms rounded outward, never shorter than the two (it read 4.0 for a wait of 4.252)."""
    jobs = [
        httpx.post(
            f"{base_url}/v1/models/identity/predict", json={"inputs": {"n": n}}, timeout=60
        ).json()
        for n in range(20)
    ]
    waits = [job["timings"]["queue_wait_ms"] for job in jobs]
    assert all(round(wait, 3) == wait for wait in waits), waits
    assert any(wait != int(wait) for wait in waits), waits
    for job, wait in zip(jobs, waits, strict=True):
        timings = job["timings"]
        assert wait >= 0 and wait + timings["engine_ms"] <= timings["total_ms"], job


def test_identity_predict(base_url: str, identity_worker: int) -> None:
    response = httpx.post(
        f"{base_url}/v1/models/identity/predict", json={"inputs": {"k": "v"}}, timeout=60
    )
    assert response.status_code == 200
    assert response.json()["outputs"] == {"k": "v"}


def test_minilm_embeddings_equal_reference(base_url: str, minilm_worker: int) -> None:
    response = httpx.post(
        f"{base_url}/v1/models/minilm/predict", json={"inputs": {"texts": SENTENCES}}, timeout=60
    )
    assert response.status_code == 200, response.text
    got = np.array(response.json()["outputs"]["embeddings"], dtype=np.float64)
    expected = reference_embeddings(SENTENCES)
    assert got.shape == (len(SENTENCES), 384)
    cosines = np.sum(got * expected, axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert cosines.min() >= 0.999, cosines


def test_minilm_job_submit_and_long_poll(base_url: str, minilm_worker: int) -> None:
    accepted = _submit(base_url, {"model": "minilm", "inputs": {"texts": ["hello"]}})
    job = httpx.get(accepted.json()["urls"]["self"], params={"wait": 30}, timeout=60).json()
    assert job["status"] == "succeeded"
    assert len(job["outputs"]["embeddings"][0]) == 384


def test_a_finished_jobs_outputs_are_answered_as_the_worker_stored_them(
    base_url: str, minilm_worker: int, stack_redis: redis.Redis
) -> None:
    """Every read of a finished job (a poll, a long poll, with attempts, the SSE final event)
    answers its outputs in the very text the job hash holds, not parsed and written again (a
    poll of a job's embeddings parsed and rewrote its numbers). The stored text is respaced
    after the job ends, which a parse and rewrite would undo."""
    accepted = _submit(base_url, {"model": "minilm", "inputs": {"texts": SENTENCES[:3]}})
    url, job_id = accepted.json()["urls"]["self"], accepted.json()["id"]
    waited = httpx.get(url, params={"wait": 30}, timeout=60).json()
    assert waited["status"] == "succeeded"
    stored = _job_hash(stack_redis, job_id)["outputs"]
    assert loads(stored) == waited["outputs"]
    respaced = stored.replace(",", ", ")
    stack_redis.hset(KEYS.job(job_id), "outputs", respaced)
    for params in ({}, {"wait": 5}, {"attempts": "true"}):
        polled = httpx.get(url, params=params, timeout=60)
        assert polled.status_code == 200 and respaced in polled.text, params
        assert polled.json()["outputs"] == waited["outputs"]
    events = httpx.get(accepted.json()["urls"]["events"], timeout=60)
    assert "event: final" in events.text and respaced in events.text


def test_minilm_vectors_as_base64_equal_the_reference(base_url: str, minilm_worker: int) -> None:
    response = httpx.post(
        f"{base_url}/v1/models/minilm/predict",
        json={"inputs": {"texts": SENTENCES, "encoding_format": "base64"}},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    packed = response.json()["outputs"]["embeddings"]
    got = np.stack([np.frombuffer(base64.b64decode(text), dtype="<f4") for text in packed])
    assert got.shape == (len(SENTENCES), 384)
    expected = reference_embeddings(SENTENCES)
    assert (got * expected).sum(axis=1).min() >= 0.999


def test_an_unknown_encoding_format_is_refused_at_submit(
    base_url: str, stack_redis: redis.Redis
) -> None:
    """Refused by minilm's input schema before anything is enqueued (no worker needed)."""
    before = stack_redis.xlen(KEYS.queue("minilm", "default"))
    refused = _submit(
        base_url, {"model": "minilm", "inputs": {"texts": ["x"], "encoding_format": "hex"}}
    )
    assert refused.status_code == 422, refused.text
    assert "encoding_format" in refused.text
    assert stack_redis.xlen(KEYS.queue("minilm", "default")) == before


def test_concurrent_minilm_jobs_are_batched(
    base_url: str, minilm_worker: int, stack_redis: redis.Redis
) -> None:
    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            bodies = [
                {"inputs": {"texts": [f"sentence number {i} about queues"]}} for i in range(64)
            ]
            responses = await asyncio.gather(
                *(client.post("/v1/models/minilm/predict", json=b) for b in bodies)
            )
        return [r.json() for r in responses]

    views = asyncio.run(run())
    assert all(v["status"] == "succeeded" for v in views)
    hashes = [_job_hash(stack_redis, v["id"]) for v in views]
    engine_calls = {h["batch_id"] for h in hashes}
    assert len(engine_calls) < 64
    assert max(int(h["batch_size"]) for h in hashes) > 1


def test_cancel_before_a_worker_reads_it(
    base_url: str, stack: Stack, stack_redis: redis.Redis
) -> None:
    accepted = _submit(base_url, {"model": "identity", "variant": "canary", "inputs": {"n": 1}})
    job_id = accepted.json()["id"]
    cancelled = httpx.delete(f"{base_url}/v1/jobs/{job_id}", timeout=10)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert httpx.delete(f"{base_url}/v1/jobs/{job_id}", timeout=10).status_code == 409

    stack.start_worker("identity:canary", name="canary-1")
    try:
        after = _submit(
            base_url, {"model": "identity", "variant": "canary", "inputs": {"n": 2}}, wait=30
        )
        assert after.status_code == 200 and after.json()["status"] == "succeeded"
    finally:
        stack.stop_process("canary-1")
    fields = _job_hash(stack_redis, job_id)
    assert fields["status"] == "cancelled"
    assert "started" not in fields and "attempts" not in fields
    assert stack_redis.xlen(KEYS.queue("identity", "canary")) == 0


def test_a_predict_whose_job_expired_in_the_queue_is_a_documented_504(
    base_url: str, stack: Stack, stack_redis: redis.Redis
) -> None:
    """The job's deadline passes while no worker serves its variant: the worker that comes
    reads it too late and ends it `expired`; the waiting predict answers 504, a status its
    OpenAPI lists. The deadline leaves the request time to arrive (one already past is 422)."""
    deadline = time.time() + 3
    body = {"variant": "canary", "inputs": {"n": 1}, "deadline": deadline}
    url = f"{base_url}/v1/models/identity/predict"
    queue = KEYS.queue("identity", "canary")
    before = stack_redis.xlen(queue)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(httpx.post, url, json=body, timeout=60)
        until(lambda: stack_redis.xlen(queue) > before or waiting.done())  # the job is queued
        until(lambda: time.time() > deadline)  # and its deadline passed
        stack.start_worker("identity:canary", name="canary-late")
        try:
            response = waiting.result(timeout=60)
        finally:
            stack.stop_process("canary-late")
    assert response.status_code == 504, response.text
    assert response.json()["error"]["type"] == "DeadlineExceeded"
    documented = httpx.get(f"{base_url}/openapi.json").json()
    assert "504" in documented["paths"]["/v1/models/{model}/predict"]["post"]["responses"]


def test_variants_use_their_own_streams_and_workers(
    base_url: str, stack: Stack, identity_worker: int, stack_redis: redis.Redis
) -> None:
    queued = _submit(base_url, {"model": "identity", "variant": "canary", "inputs": {"v": "c"}})
    job_id = queued.json()["id"]
    assert stack_redis.xlen(KEYS.queue("identity", "canary")) == 1
    result: dict[str, Any] = {}

    def long_poll() -> None:
        started = time.monotonic()
        url = f"{base_url}/v1/jobs/{job_id}"
        result["job"] = httpx.get(url, params={"wait": 60}, timeout=90).json()
        result["elapsed"] = time.monotonic() - started

    poller = threading.Thread(target=long_poll)
    poller.start()
    canary_pid = stack.start_worker("identity:canary", name="canary-2")
    try:
        poller.join(timeout=90)
        default = _submit(base_url, {"model": "identity", "inputs": {"v": "d"}}, wait=30).json()
    finally:
        stack.stop_process("canary-2")
    assert result["job"]["status"] == "succeeded" and result["elapsed"] < 60
    assert _job_hash(stack_redis, job_id)["worker"] == stack.consumer_name(canary_pid)
    assert _job_hash(stack_redis, default["id"])["worker"] == stack.consumer_name(identity_worker)


@pytest.mark.parametrize(
    ("body", "status", "error_type"),
    [
        ({"model": "nope", "inputs": {}}, 404, "not_found"),
        ({"model": "identity", "variant": "nope", "inputs": {}}, 404, "not_found"),
        ({"model": "minilm", "inputs": {"texts": "not a list"}}, 422, "invalid_request"),
        ({"model": "minilm", "inputs": {"texts": []}}, 422, "invalid_request"),
        ({"model": "minilm", "inputs": {"txts": ["typo"]}}, 422, "invalid_request"),
        ({"model": "identity"}, 422, "invalid_request"),
        ({"model": "identity", "inputs": {}, "unknown": 1}, 422, "invalid_request"),
        ({"model": "Bad Name", "inputs": {}}, 422, "invalid_request"),
    ],
)
def test_bad_submissions_get_json_errors(
    base_url: str, body: dict[str, Any], status: int, error_type: str
) -> None:
    response = _submit(base_url, body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] == error_type and error["message"]


def test_malformed_json_is_422(base_url: str) -> None:
    response = httpx.post(
        f"{base_url}/v1/jobs",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 422 and response.json()["error"]["type"] == "invalid_request"
    # and the schema says so: it listed a 400 that no jobs route ever answers
    documented = httpx.get(f"{base_url}/openapi.json", timeout=10).json()["paths"]
    for path, method in (("/v1/jobs", "post"), ("/v1/models/{model}/predict", "post")):
        responses = documented[path][method]["responses"]
        assert "400" not in responses and "JSON" in responses["422"]["description"]


def test_a_poll_of_an_unknown_job_subscribes_nothing(
    base_url: str, stack_redis: redis.Redis
) -> None:
    """A long-poll subscribed the reply channel its id's tag named before it knew the job
    existed: any caller could make a producer hold up to 65,536 channels for good, each
    subscribed again at every reconnection."""
    before = set(stack_redis.execute_command("PUBSUB", "SHARDCHANNELS"))
    for tag in ("fffe", "ffff"):
        unknown = httpx.get(f"{base_url}/v1/jobs/{tag}{'0' * 28}", params={"wait": 0.1})
        assert unknown.status_code == 404, unknown.text
    assert set(stack_redis.execute_command("PUBSUB", "SHARDCHANNELS")) == before


def test_oversized_body_is_413(base_url: str) -> None:
    body = {"model": "minilm", "inputs": {"texts": ["x" * 2_000_000]}}
    response = _submit(base_url, body)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "payload_too_large"


def test_unknown_job_is_404(base_url: str) -> None:
    for method in ("GET", "DELETE"):
        response = httpx.request(method, f"{base_url}/v1/jobs/{'0' * 32}", timeout=10)
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"
    assert httpx.get(f"{base_url}/v1/jobs/not-an-id", timeout=10).status_code == 404


def test_models_lists_partitions_with_queue_stats(base_url: str, identity_worker: int) -> None:
    models = httpx.get(f"{base_url}/v1/models", timeout=10).json()
    assert models["object"] == "list"
    identity = next(m for m in models["data"] if m["id"] == "identity")
    default = next(p for p in identity["partitions"] if p["variant"] == "default")
    assert default["stream"] == KEYS.queue("identity", "default")
    assert default["consumers"] >= 1 and default["lag"] == 0 and default["pending"] == 0


def test_health_and_readiness(base_url: str) -> None:
    health = httpx.get(f"{base_url}/healthz", timeout=10).json()
    assert health == {"status": "ok", "instance": "producer"}  # the stack's instance id
    ready = httpx.get(f"{base_url}/readyz", timeout=10).json()
    assert ready["status"] == "ready" and "minilm" in ready["models"]

"""Batches end to end on the real pipeline: a 2,000-line JSONL batch against the real minilm
encoder with malformed lines among the valid ones, cancellation, expiry of what a completion
window leaves, tenancy, and how much a progress read costs Redis."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import yaml

from conveyor.client import Client
from conveyor.stack import Stack, free_port
from producer_api.app import create_app
from shared.job_store import now_ms
from shared.keys import Keys
from shared.settings import Settings
from tests.conftest import REPO_ROOT, issue_key, until

pytestmark = pytest.mark.slow
OPENAPI = create_app().openapi()
ENDED = {"completed", "failed", "cancelled", "expired"}

# Twenty malformed lines, each kind at least once, at lines 50, 150, ..., 1950 (1-based): what
# each holds and the error type the errors file must give it. The last two are JSON the request
# boundary refuses in a JSON body (a lone surrogate, an integer beyond 64 bits).
MALFORMED: list[tuple[str, str]] = [
    ('{"custom_id": "broken", "body": {', "invalid_json"),
    ('{"body": {"inputs": {"texts": ["no custom_id"]}}}', "invalid_request"),
    (
        '{"custom_id": "item-0", "body": {"inputs": {"texts": ["duplicate"]}}}',
        "duplicate_custom_id",
    ),
    ('{"custom_id": "bad-{n}", "body": {"inputs": {"texts": "not a list"}}}', "invalid_request"),
    ('{"custom_id": "bad-{n}", "body": {"input": {"texts": ["typo"]}}}', "invalid_request"),
    ('{"custom_id": "bad-{n}", "body": {"model": "identity", "inputs": {}}}', "model_mismatch"),
    ("[1, 2, 3]", "invalid_request"),
    ('{"custom_id": "bad-{n}", "body": {"inputs": {"texts": []}}}', "invalid_request"),
    (
        '{"custom_id": "bad-{n}", "body": {"variant": "nope", "inputs": {"texts": ["x"]}}}',
        "not_found",
    ),
    ('{"custom_id": "bad-{n}", "url": "/v1/other", "body": {"inputs": {}}}', "invalid_request"),
    ('{"custom_id": "bad-{n}", "body": {"inputs": {"texts": ["\\ud800"]}}}', "invalid_json"),
    ('{"custom_id": "bad-{n}", "body": {"inputs": {"n": 99999999999999999999}}}', "invalid_json"),
]


def _text(i: int) -> str:
    return f"sentence {i}: a queue in front of a model lets bursts wait"


def _minilm_batch() -> tuple[str, dict[int, str], dict[int, str]]:
    """(JSONL, valid line → custom_id, malformed line → expected error type)."""
    lines: list[str] = []
    valid: dict[int, str] = {}
    malformed: dict[int, str] = {}
    for number in range(1, 2001):
        if number % 100 == 50:
            content, expected = MALFORMED[len(malformed) % len(MALFORMED)]
            lines.append(content.replace("{n}", str(number)))
            malformed[number] = expected
        else:
            custom_id = f"item-{len(valid)}"
            lines.append(
                json.dumps({"custom_id": custom_id, "body": {"inputs": {"texts": [_text(number)]}}})
            )
            valid[number] = custom_id
    return "\n".join(lines) + "\n", valid, malformed


def _create(base_url: str, source: str | bytes, **params: Any) -> dict[str, Any]:
    response = httpx.post(
        f"{base_url}/v1/batches",
        params=params,
        content=source,
        headers={"Content-Type": "application/jsonl"},
        timeout=120,
    )
    assert response.status_code == 202, response.text
    batch: dict[str, Any] = response.json()
    return batch


def _wait_ended(base_url: str, batch_id: str, timeout: float = 240) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        batch: dict[str, Any] = httpx.get(f"{base_url}/v1/batches/{batch_id}", timeout=30).json()
        return batch if batch["status"] in ENDED else None

    batch: dict[str, Any] = until(ended, timeout)
    return batch


def _jsonl(base_url: str, batch_id: str, name: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{base_url}/v1/batches/{batch_id}/{name}", timeout=120)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/jsonl")
    return [json.loads(line) for line in response.text.splitlines()]


def test_2000_line_batch_against_minilm(base_url: str, minilm_worker: int) -> None:
    source, valid, malformed = _minilm_batch()
    started = time.monotonic()
    created = _create(base_url, source, model="minilm")
    batch = _wait_ended(base_url, created["id"])
    elapsed = time.monotonic() - started
    print(f"\n2,000-line minilm batch: {elapsed:.1f}s from POST to completed")

    assert batch["status"] == "completed"
    counts = batch["counts"]
    assert counts == {
        "total": 2000, "succeeded": 1980, "failed": 20, "pending": 0,
        "invalid": 20, "cancelled": 0, "expired": 0,
    }  # fmt: skip
    assert batch["in_progress_at"] <= batch["finalizing_at"] <= batch["completed_at"]

    outputs = _jsonl(base_url, batch["id"], "output")
    assert len(outputs) == 1980
    assert {o["line"]: o["custom_id"] for o in outputs} == valid
    sample = outputs[::45]  # each output must be the embedding of its own line's text
    got = np.array([o["outputs"]["embeddings"][0] for o in sample])
    texts = [_text(o["line"]) for o in sample]
    online = httpx.post(
        f"{base_url}/v1/models/minilm/predict", json={"inputs": {"texts": texts}}, timeout=60
    )
    expected = np.array(online.json()["outputs"]["embeddings"])
    cosines = np.sum(got * expected, axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert cosines.min() >= 0.999, cosines

    errors = _jsonl(base_url, batch["id"], "errors")
    assert {e["line"]: e["error"]["type"] for e in errors} == malformed
    assert all(e["status"] == "invalid" and e["error"]["message"] for e in errors)
    assert [e["line"] for e in errors] == sorted(malformed)


def _canary_lines(count: int) -> str:
    """identity:canary has no worker in these tests: its items stay queued until acted on."""
    body = {"variant": "canary", "inputs": {"n": 1}}
    return "".join(json.dumps({"custom_id": f"c{i}", "body": body}) + "\n" for i in range(count))


def _hgets(client: redis.Redis) -> int:
    """HGETs the server has run, scripts' included. Server-wide: the stack's periodic reads
    (sweeper, queue ETA, workers) land in it too, so the bounds below leave them room."""
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_hget", {}).get("calls", 0))


def test_cancel_stops_the_rest(base_url: str, stack_redis: redis.Redis) -> None:
    files = {"file": ("items.jsonl", _canary_lines(600).encode(), "application/jsonl")}
    response = httpx.post(
        f"{base_url}/v1/batches", data={"model": "identity"}, files=files, timeout=60
    )
    assert response.status_code == 202, response.text
    batch_id = response.json()["id"]
    assert httpx.get(f"{base_url}/v1/batches/{batch_id}/output").status_code == 409

    before = _hgets(stack_redis)
    look = httpx.get(f"{base_url}/v1/batches/{batch_id}").json()
    looked = _hgets(stack_redis) - before
    assert look["status"] == "in_progress" and look["counts"]["pending"] == 600
    assert looked < 400, f"one progress read cost {looked} HGETs for 600 open items"

    cancelled = httpx.post(f"{base_url}/v1/batches/{batch_id}/cancel", timeout=30)
    assert cancelled.status_code == 200, cancelled.text
    batch = cancelled.json()
    assert batch["status"] == "cancelled" and batch["cancelled_at"] is not None
    assert batch["counts"]["cancelled"] == 600 and batch["counts"]["pending"] == 0
    again = httpx.post(f"{base_url}/v1/batches/{batch_id}/cancel", timeout=30)
    assert again.status_code == 409 and again.json()["error"]["type"] == "conflict"

    errors = _jsonl(base_url, batch_id, "errors")
    assert [e["custom_id"] for e in errors] == [f"c{i}" for i in range(600)]
    assert {(e["status"], e["error"]["type"]) for e in errors} == {("cancelled", "cancelled")}
    assert _jsonl(base_url, batch_id, "output") == []
    job = stack_redis.hgetall(Keys().job(errors[0]["id"]))
    assert job["status"] == "cancelled" and job["batch"] == batch_id

    before = _hgets(stack_redis)
    httpx.get(f"{base_url}/v1/batches/{batch_id}")
    assert _hgets(stack_redis) - before < 100, "an ended batch's read touched its items"


def test_completion_window_expires_the_rest(base_url: str) -> None:
    created = _create(base_url, _canary_lines(50), model="identity", completion_window="2s")
    assert created["expires_at"] - created["created_at"] == pytest.approx(2.0, abs=0.01)
    batch = _wait_ended(base_url, created["id"], timeout=30)
    assert batch["status"] == "expired" and batch["expired_at"] >= batch["expires_at"]
    assert batch["counts"]["expired"] == 50 and batch["counts"]["failed"] == 50
    # no output line: no output file id, as OpenAI's batch object (an empty file was named)
    assert batch["output_file_id"] is None and batch["error_file_id"] == f"{batch['id']}-errors"
    errors = _jsonl(base_url, batch["id"], "errors")
    assert len(errors) == 50 and {e["error"]["type"] for e in errors} == {"expired"}


def test_an_item_running_when_the_window_ends_expires_without_its_result(
    base_url: str, stack_redis: redis.Redis
) -> None:
    """The window's end expires running items as well as queued ones (`progress.end`): a
    result that comes later is not the output file's, as after a cancel."""
    keys = Keys()
    created = _create(base_url, _canary_lines(3), model="identity", completion_window="1h")
    done, running, _ = stack_redis.lrange(keys.batch_items(created["id"]), 0, -1)
    stack_redis.hset(keys.job(done), mapping={"status": "succeeded", "outputs": '{"n": 1}'})
    stack_redis.hset(keys.job(running), "status", "running")  # as the worker taking it does
    stack_redis.zadd(keys.batches_active, {created["id"]: 0})  # its window has run out
    batch = _wait_ended(base_url, created["id"], timeout=30)
    assert batch["status"] == "expired", batch
    assert batch["counts"]["succeeded"] == 1 and batch["counts"]["expired"] == 2
    assert stack_redis.hget(keys.job(running), "status") == "expired"
    assert [line["id"] for line in _jsonl(base_url, batch["id"], "output")] == [done]
    expired = {e["id"] for e in _jsonl(base_url, batch["id"], "errors")}
    assert running in expired and len(expired) == 2


WINDOWED_WORKERS = ("windowed-producer", "windowed-default", "windowed-late")


@pytest.fixture
def windowed(stack: Stack, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A producer (its URL, and the env its children need) whose repository holds `windowed`:
    the paced generate model of tests/paced_engine.py, whose variants are served apart:
    `default` by a worker started here, `late` by one the test starts when it wants, `never` by
    none."""
    config = yaml.safe_load(
        (REPO_ROOT / "tests/fixtures/paced_repository/paced/config.yaml").read_text()
    )
    config["variants"] = {"default": {"weight": 100}, "late": {"weight": 0}, "never": {"weight": 0}}
    (tmp_path / "windowed").mkdir()
    (tmp_path / "windowed" / "config.yaml").write_text(yaml.safe_dump(config))
    env = {"CONVEYOR_MODEL_REPOSITORY": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    try:
        # side by side: the worker loads its engine while the producer starts
        stack.spawn_worker("windowed:default", "windowed-default", **env)
        url = stack.start_producer(free_port(), "windowed-producer", **env)
        stack.wait_ready("windowed-default")
        yield url, env
    finally:
        stack.stop_processes([name for name in WINDOWED_WORKERS if name in stack.processes])


def test_an_expired_batch_answers_only_what_finished_within_its_window(
    windowed: tuple[str, dict[str, str]], stack: Stack, stack_redis: redis.Redis
) -> None:
    """OpenAI's expired batch answers only the requests completed before it expired: a result
    that came after the window's end (here from a worker that came late) is the errors file's
    `batch_expired`, not the output file's, and is counted as expired. The window is ended by
    ordering, between the two results, not by the clock."""
    url, env = windowed
    keys = Keys()
    body = {"model": "windowed", "prompt": "word", "max_tokens": 2}
    source = "".join(
        json.dumps({"custom_id": c, "url": "/v1/completions", "body": {**body, "variant": v}})
        + "\n"
        for c, v in (("early", "default"), ("late", "late"), ("never", "never"))
    )
    batch_id = _create(url, source, completion_window="1h")["id"]
    early, late, _ = stack_redis.lrange(keys.batch_items(batch_id), 0, -1)
    until(lambda: stack_redis.hget(keys.job(early), "status") == "succeeded", 60)
    window_end = now_ms()  # `early` has its result; `late` has no worker yet
    stack.start_worker("windowed:late", "windowed-late", **env)
    until(lambda: stack_redis.hget(keys.job(late), "status") == "succeeded", 120)
    stamps = [int(stack_redis.hget(keys.job(job_id), "finished") or 0) for job_id in (early, late)]
    assert stamps[0] <= window_end < stamps[1], (stamps, window_end)
    stack_redis.hset(keys.batch(batch_id), "expires_at", window_end)  # the window ended then,
    stack_redis.zadd(keys.batches_active, {batch_id: 0})  # and the sweeper now finds it so

    batch = _wait_ended(url, batch_id, timeout=60)
    assert batch["status"] == "expired", batch
    output, errors = _jsonl(url, batch_id, "output"), _jsonl(url, batch_id, "errors")
    assert [(o["custom_id"], o["response"]["status_code"]) for o in output] == [("early", 200)]
    assert [(e["custom_id"], e["status"], e["error"]["code"], e["response"]) for e in errors] == [
        ("late", "expired", "batch_expired", None),
        ("never", "expired", "batch_expired", None),
    ]
    assert batch["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert (batch["counts"]["succeeded"], batch["counts"]["expired"]) == (1, 2)


def test_a_batch_items_record_outlives_its_window(base_url: str, stack_redis: redis.Redis) -> None:
    """An item's hash lived the result TTL from its submit: with a 24 h window and the default
    24 h TTL it expired as the window ran out, before the sweeper ended the batch, and the
    errors file named its line `custom_id: null, line: 0`."""
    created = _create(base_url, _canary_lines(2), model="identity", completion_window="1h")
    result_ttl_s = Settings().result_ttl_s
    items = stack_redis.lrange(Keys().batch_items(created["id"]), 0, -1)
    assert len(items) == 2 and created["counts"]["total"] == 2, created  # both enqueued
    for job_id in items:
        assert stack_redis.ttl(Keys().job(job_id)) > result_ttl_s + 3_500
    cancelled = httpx.post(f"{base_url}/v1/batches/{created['id']}/cancel", timeout=30)
    assert cancelled.status_code == 200, cancelled.text


def test_refused_batches(base_url: str) -> None:
    def post(source: bytes, **params: Any) -> httpx.Response:
        return httpx.post(f"{base_url}/v1/batches", params=params, content=source, timeout=30)

    empty = post(b"\n\n", model="identity")
    assert empty.status_code == 422 and "no lines" in empty.json()["error"]["message"]
    unknown = post(b'{"custom_id": "a", "body": {"inputs": {}}}', model="nope")
    assert unknown.status_code == 404
    window = post(b'{"custom_id": "a", "body": {"inputs": {}}}', completion_window="24x")
    assert window.status_code == 422
    assert httpx.get(f"{base_url}/v1/batches/batch_{'0' * 32}").status_code == 404
    assert httpx.get(f"{base_url}/v1/batches/not-an-id").status_code == 404

    all_bad = _create(base_url, b"{oops\n[]\n", model="identity")
    assert all_bad["status"] == "failed" and all_bad["counts"]["invalid"] == 2
    assert [e["line"] for e in _jsonl(base_url, all_bad["id"], "errors")] == [1, 2]


def test_batches_belong_to_their_tenant(auth_stack: Stack) -> None:
    """A batch, the file it was made from, its output file and the list of batches are each
    their tenant's alone."""
    # tenants of their own: other tests on this stack create batches too (their lists differ)
    suffix = uuid.uuid4().hex[:8]
    acme = issue_key(auth_stack.redis_url, f"acme-{suffix}", "submit", "read")
    other = issue_key(auth_stack.redis_url, f"globex-{suffix}", "submit", "read")
    url = f"{auth_stack.base_url}/v1/batches"
    source = _canary_lines(3).encode()
    anonymous = httpx.post(url, params={"model": "identity"}, content=source)
    assert anonymous.status_code == 401
    created = httpx.post(
        url, params={"model": "identity"}, content=source, headers={"X-API-Key": acme}
    )
    assert created.status_code == 202, created.text
    batch_id = created.json()["id"]
    mine = httpx.get(f"{url}/{batch_id}", headers={"X-API-Key": acme})
    theirs = httpx.get(f"{url}/{batch_id}", headers={"X-API-Key": other})
    assert mine.status_code == 200 and theirs.status_code == 404
    assert httpx.post(f"{url}/{batch_id}/cancel", headers={"X-API-Key": other}).status_code == 404

    # An uploaded input file is its tenant's too: another can neither read it nor run it.
    files = f"{auth_stack.base_url}/v1/files"
    uploaded = httpx.post(
        files,
        files={"file": ("a.jsonl", source)},
        data={"purpose": "batch"},
        headers={"X-API-Key": acme},
    )
    assert uploaded.status_code == 200, uploaded.text
    file_id = uploaded.json()["id"]
    for key, status in ((acme, 200), (other, 404)):
        assert httpx.get(f"{files}/{file_id}", headers={"X-API-Key": key}).status_code == status
        content = httpx.get(f"{files}/{file_id}/content", headers={"X-API-Key": key})
        assert content.status_code == status
        if status == 200:  # sent as the OpenAPI documents it
            documented = OPENAPI["paths"]["/v1/files/{file_id}/content"]["get"]["responses"]
            assert content.headers["content-type"] in documented["200"]["content"]
    named = {"input_file_id": file_id, "endpoint": "/v1/jobs", "model": "identity"}
    refused = httpx.post(url, json=named, headers={"X-API-Key": other})
    assert refused.status_code == 404
    run = httpx.post(url, json=named, headers={"X-API-Key": acme})
    assert run.status_code == 202 and run.json()["counts"]["total"] == 3, run.text
    theirs_out = httpx.get(f"{files}/{batch_id}-output/content", headers={"X-API-Key": other})
    assert theirs_out.status_code == 404

    # Each tenant lists its own batches, newest first, a page at a time.
    with Client(auth_stack.base_url, api_key=acme) as client:
        first = client.batches.list(limit=1)
        assert [b.id for b in first.data] == [run.json()["id"]] and first.has_more
        rest = client.batches.list(limit=5, after=first.last_id)
        assert [b.id for b in rest.data] == [batch_id] and not rest.has_more
    with Client(auth_stack.base_url, api_key=other) as client:
        assert client.batches.list().data == []


def test_each_tenant_lists_its_own_files_a_page_at_a_time(auth_stack: Stack) -> None:
    """OpenAI's `GET /v1/files`: newest first (oldest with `order=asc`), `after=last_id` pages
    on; a deleted file, or one whose key expired, is not listed and leaves the index; another
    tenant lists none of them."""
    tenant = f"acme-{uuid.uuid4().hex[:8]}"
    acme = issue_key(auth_stack.redis_url, tenant, "submit", "read")
    other = issue_key(auth_stack.redis_url, f"globex-{uuid.uuid4().hex[:8]}", "submit", "read")
    url = f"{auth_stack.base_url}/v1/files"

    def upload(name: str) -> str:
        time.sleep(0.002)  # a millisecond apart: the index orders by upload time in ms
        data = {"purpose": "batch"}
        uploaded = httpx.post(
            url, files={"file": (name, _canary_lines(1))}, data=data, headers={"X-API-Key": acme}
        )
        assert uploaded.status_code == 200, uploaded.text
        file_id: str = uploaded.json()["id"]
        return file_id

    def listed(key: str = acme, **params: Any) -> dict[str, Any]:
        page = httpx.get(url, params=params, headers={"X-API-Key": key}, timeout=30)
        assert page.status_code == 200, page.text
        body: dict[str, Any] = page.json()
        assert body["object"] == "list"
        return body

    ids = [upload(f"{n}.jsonl") for n in range(4)]
    first = listed(limit=3)
    assert [f["id"] for f in first["data"]] == ids[:0:-1] and first["has_more"]
    assert first["data"][0]["filename"] == "3.jsonl" and first["last_id"] == ids[1]
    rest = listed(limit=3, after=first["last_id"])
    assert [f["id"] for f in rest["data"]] == ids[:1] and not rest["has_more"]
    assert [f["id"] for f in listed(order="asc")["data"]] == ids
    assert [f["id"] for f in listed(limit=10_000)["data"]] == ids[::-1]  # OpenAI's largest
    assert listed(purpose="fine-tune")["data"] == []
    assert listed(other)["data"] == []

    deleted = httpx.delete(f"{url}/{ids[3]}", headers={"X-API-Key": acme})
    assert deleted.status_code == 200, deleted.text
    server = redis.Redis.from_url(auth_stack.redis_url)
    server.delete(Keys().file(ids[2]))  # as its TTL would
    assert [f["id"] for f in listed()["data"]] == [ids[1], ids[0]]
    assert server.zcard(Keys().files_of(tenant)) == 2  # the deleted and the expired left it
    assert (
        httpx.get(url, params={"order": "sideways"}, headers={"X-API-Key": acme}).status_code == 400
    )


def test_a_batch_whose_keys_expired_leaves_the_list(
    base_url: str, stack_redis: redis.Redis
) -> None:
    """The tenant index outlives nothing it lists: an entry whose batch is gone is passed
    over and dropped, and the page is filled from the ones after it."""
    kept = _create(base_url, _canary_lines(1), model="identity")["id"]
    expired = _create(base_url, _canary_lines(1), model="identity")["id"]
    index = Keys().batches_of("default")
    assert stack_redis.zscore(index, expired) is not None
    stack_redis.delete(Keys().batch(expired))  # as its TTL would
    page = httpx.get(f"{base_url}/v1/batches", params={"limit": 1}, timeout=30).json()
    assert [b["id"] for b in page["data"]] == [kept]
    assert stack_redis.zscore(index, expired) is None


@pytest.fixture
def capped_url(stack: Stack) -> Iterator[str]:
    """A producer of the stack's whose batches may hold at most 3 lines."""
    try:
        yield stack.start_producer(free_port(), "capped-producer", CONVEYOR_MAX_BATCH_LINES="3")
    finally:
        stack.stop_processes(["capped-producer"])


def test_a_batch_over_the_line_limit_is_refused_before_anything_is_stored(
    capped_url: str, stack_redis: redis.Redis
) -> None:
    """Each refused line was stored as an errors-file record for the window and the result TTL:
    a 1 MiB body of `x` lines kept ~80 MB in Redis for one rate-limit token, and a file uploaded
    once could be named by any number of creates. Blank lines count toward no limit."""
    url = f"{capped_url}/v1/batches"
    stored = set(stack_redis.scan_iter("cv:batch:*"))
    listed = stack_redis.zcard(Keys().batches_of("default"))
    over = httpx.post(url, params={"model": "identity"}, content=b"x\n\n" * 4, timeout=30)
    uploaded = httpx.post(
        f"{capped_url}/v1/files", files={"file": ("x.jsonl", b"x\n" * 4)}, data={"purpose": "batch"}
    )
    assert uploaded.status_code == 200, uploaded.text
    named = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/jobs", "model": "identity"}
    over_by_file = httpx.post(url, json=named, timeout=30)
    for refused in (over, over_by_file):
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert error["type"] == "payload_too_large"
        assert "CONVEYOR_MAX_BATCH_LINES" in error["message"] and "3" in error["message"]
    assert set(stack_redis.scan_iter("cv:batch:*")) == stored
    assert stack_redis.zcard(Keys().batches_of("default")) == listed

    at_limit = _create(capped_url, "\n" + _canary_lines(3) + "\n\n", model="identity")
    assert at_limit["counts"]["total"] == 3, at_limit

"""OpenAI's Batch API on the real pipeline (producer, Celery worker, embedded Valkey, minilm on
ONNX Runtime): a file of `/v1/embeddings` lines runs each as the job its request is, the output
file answers each as the route would (OpenAI's batch output line), lines the route would refuse
go to the errors file, and the SDK and CLI read the result; the official `openai` client runs
the whole flow through the Files API. Chat and completion lines run on the real SmolLM2 in
tests/test_llm_pipeline.py; tenancy of files and lists in tests/test_batches.py."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from conveyor.client import Client
from conveyor.commands.batch import write_results
from producer_api.app import create_app
from producer_api.batch_api.protocol import EMBEDDINGS
from producer_api.batch_api.serving import _error, _openai_error
from producer_api.errors import ConveyorError
from producer_api.openai.serving import Generation, generation_of
from producer_api.state import ProducerState
from shared.batch_api_store import ItemState
from shared.codec import RequestEntry
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import Keys, new_job_id
from shared.settings import Settings
from tests.conftest import until
from tests.minilm_reference import (
    SENTENCES,
    assert_usage_counts_tokens,
    cosines,
    reference_embeddings,
)
from tests.test_batches import _create, _jsonl, _wait_ended

pytestmark = pytest.mark.slow
TEXTS = [s for s in SENTENCES if s][:4]  # an empty text is refused, as OpenAI refuses it


def _line(custom_id: str, body: dict[str, Any], url: str = "/v1/embeddings") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


# (custom_id, line) of the lines that run, and of those refused with the error type and a
# needle of its message; one url per batch, set by its first valid line.
RUN = [
    ("one", _line("one", {"model": "minilm", "input": TEXTS[0]})),
    ("many", _line("many", {"model": "minilm", "input": TEXTS})),
    ("packed", _line("packed", {"model": "minilm", "input": TEXTS, "encoding_format": "base64"})),
]
REFUSED = [
    ("ids", {"model": "minilm", "input": [[101, 102]]}, None, "check_embedding_ctx_length"),
    ("identity", {"model": "identity", "input": "x"}, None, "does not embed text"),
    ("cut", {"model": "minilm", "input": "x", "dimensions": 8}, None, "whole vectors only"),
    # named as the line's body has it (`input`), not as the job stores it (`inputs['texts']`)
    ("long", {"model": "minilm", "input": ["x"] * 257}, None, "input: "),
    ("job", {"model": "minilm", "inputs": {"texts": ["x"]}}, "/v1/jobs", "this batch is for"),
    ("responses", {"model": "minilm", "input": "x"}, "/v1/responses", "url"),
]
ERROR_TYPES = ["invalid_request"] * 4 + ["url_mismatch", "invalid_request"]


def _source() -> str:
    refused = [_line(cid, body, url or "/v1/embeddings") for cid, body, url, _ in REFUSED]
    return "\n".join([line for _, line in RUN] + refused) + "\n"


def _vectors(body: dict[str, Any]) -> np.ndarray:
    return np.array(
        [
            np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
            if isinstance(item["embedding"], str)
            else item["embedding"]
            for item in body["data"]
        ]
    )


def test_an_openai_batch_of_embeddings_answers_as_the_route(
    base_url: str, minilm_worker: int, tmp_path: Path
) -> None:
    created = _create(base_url, _source())
    assert created["endpoint"] == "/v1/embeddings" and created["model"] == "minilm"
    batch = _wait_ended(base_url, created["id"])
    assert batch["status"] == "completed", batch
    assert (batch["counts"]["succeeded"], batch["counts"]["invalid"]) == (3, len(REFUSED))

    outputs = _jsonl(base_url, batch["id"], "output")
    assert [(o["custom_id"], o["line"]) for o in outputs] == [
        ("one", 1),
        ("many", 2),
        ("packed", 3),
    ]
    expected = reference_embeddings(TEXTS)
    for output, texts in zip(outputs, ([TEXTS[0]], TEXTS, TEXTS), strict=True):
        response = output["response"]
        assert output["error"] is None and "outputs" not in output
        assert response["status_code"] == 200 and response["request_id"] == output["id"]
        body = response["body"]
        assert body["object"] == "list" and body["model"] == "minilm"
        assert [item["index"] for item in body["data"]] == list(range(len(texts)))
        assert cosines(_vectors(body), expected[: len(texts)]).min() >= 0.999
        assert_usage_counts_tokens([{"texts": texts}], [body])
        job = httpx.get(f"{base_url}/v1/jobs/{output['id']}", timeout=30).json()
        assert job["status"] == "succeeded" and job["model"] == "minilm"
    assert isinstance(outputs[2]["response"]["body"]["data"][0]["embedding"], str)

    errors = _jsonl(base_url, batch["id"], "errors")
    assert [e["line"] for e in errors] == list(range(4, 4 + len(REFUSED)))
    assert [e["error"]["type"] for e in errors] == ERROR_TYPES
    for error, (custom_id, _, _, needle) in zip(errors, REFUSED, strict=True):
        assert error["custom_id"] == custom_id and needle in error["error"]["message"], error
        # OpenAI's batch line as well: never ran, so no response, and the error has its code
        assert error["id"] is None and error["response"] is None, error
        assert error["error"]["code"] == error["error"]["type"], error

    # The SDK reads OpenAI's lines; the CLI writes them back as they were served.
    with Client(base_url) as client:
        assert client.batches.get(batch["id"]).endpoint == "/v1/embeddings"
        results = client.batches.results(batch["id"])
    assert [o.response["status_code"] for o in results.outputs if o.response] == [200] * 3
    write_results(results, tmp_path / "out.jsonl", tmp_path / "err.jsonl", batch["id"])
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert written == outputs
    # the errors file too: its nulls (`id`, `response` of a line that never ran) were dropped,
    # and readers of OpenAI's format met a KeyError
    refused = [json.loads(line) for line in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert refused == errors


def test_a_batch_of_jobs_says_so_and_keeps_its_output_lines(
    base_url: str, identity_worker: int
) -> None:
    source = _line("a", {"inputs": {"x": 1}}, url="/v1/jobs") + "\n"
    source += _line("b", {"model": "identity", "input": "x"}) + "\n"
    created = _create(base_url, source, model="identity")
    assert created["endpoint"] == "/v1/jobs"
    batch = _wait_ended(base_url, created["id"])
    [output] = _jsonl(base_url, batch["id"], "output")
    assert output["outputs"] == {"x": 1} and "response" not in output
    [error] = _jsonl(base_url, batch["id"], "errors")
    assert (error["custom_id"], error["error"]["type"]) == ("b", "url_mismatch")
    assert "response" not in error and "code" not in error["error"]  # Conveyor's line only


def test_the_official_clients_output_expires_after_keeps_a_batchs_files_that_long(
    base_url: str, identity_worker: int, stack_redis: redis.Redis
) -> None:
    """OpenAI's `output_expires_after` (refused: the create forbade it): an hour from each
    file's creation, the batch's end, which the files' objects say and their keys keep."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    source = _line("a", {"model": "identity", "inputs": {"x": 1}}, url="/v1/jobs") + "\n"
    source += _line("b", {"model": "identity", "input": "x"}) + "\n"
    upload = client.files.create(file=("jobs.jsonl", source.encode()), purpose="batch")
    created = client.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/jobs",  # type: ignore[arg-type]  # Conveyor's own route
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 3600},
    )
    until(lambda: client.batches.retrieve(created.id).status == "completed")
    batch = client.batches.retrieve(created.id)
    assert batch.output_file_id and batch.error_file_id, batch
    output, errors = map(client.files.retrieve, (batch.output_file_id, batch.error_file_id))
    assert output.created_at == errors.created_at == batch.completed_at
    assert output.expires_at == errors.expires_at == batch.completed_at + 3600
    [line] = [json.loads(text) for text in client.files.content(output.id).text.splitlines()]
    assert line["outputs"] == {"x": 1}
    assert stack_redis.expiretime(Keys().job(line["id"])) == output.expires_at
    assert stack_redis.ttl(Keys().batch(batch.id)) > 3600  # the batch: a result TTL


def test_the_official_client_runs_a_batch_through_the_files_api(
    base_url: str, minilm_worker: int
) -> None:
    """OpenAI's flow unchanged: upload the input file, create the batch by its id, poll it,
    download its output and error files by the ids it gives; they are the batch's files."""
    from openai import BadRequestError, NotFoundError, OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    source = _source().encode()
    upload = client.files.create(file=("embed.jsonl", source), purpose="batch")
    assert (upload.bytes, upload.purpose, upload.filename) == (len(source), "batch", "embed.jsonl")
    assert client.files.retrieve(upload.id).bytes == len(source)
    assert client.files.content(upload.id).content == source
    assert upload.id in {f.id for f in client.files.list()}

    created = client.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata={"run": "nightly"},
    )
    assert (created.endpoint, created.input_file_id) == ("/v1/embeddings", upload.id)
    assert created.metadata == {"run": "nightly"} and created.output_file_id is None
    assert [b.id for b in client.batches.list(limit=1).data] == [created.id]
    until(lambda: client.batches.retrieve(created.id).status == "completed", timeout=240)
    batch = client.batches.retrieve(created.id)
    assert batch.request_counts is not None
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (3 + len(REFUSED), 3, len(REFUSED))
    assert batch.output_file_id and batch.error_file_id
    # the lines its create refused, as OpenAI's batch object names them (it was null)
    assert batch.errors is not None and batch.errors.data is not None
    refused = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert refused == [(len(RUN) + 1 + i, kind, None) for i, kind in enumerate(ERROR_TYPES)]
    # whole seconds, as OpenAI gives them (a client with integer types could not read fractions)
    raw = httpx.get(f"{base_url}/v1/batches/{batch.id}", timeout=30).json()
    times = ("created_at", "in_progress_at", "finalizing_at", "completed_at", "expires_at")
    assert all(type(raw[name]) is int for name in times), raw
    for file_id, name in ((batch.output_file_id, "output"), (batch.error_file_id, "errors")):
        content = client.files.content(file_id)
        lines = [json.loads(line) for line in content.text.splitlines()]
        assert lines == _jsonl(base_url, batch.id, name)
        retrieved = client.files.retrieve(file_id)  # it was a 404: the id named no upload
        assert (retrieved.id, retrieved.purpose) == (file_id, "batch_output")
        assert retrieved.bytes == len(content.content) and retrieved.created_at > 0
        # it goes with the batch, a result TTL after it ended (both were missing)
        assert retrieved.expires_at == retrieved.created_at + Settings().result_ttl_s
        assert retrieved.status == "processed"
    assert lines[0]["custom_id"] == REFUSED[0][0]
    assert client.files.delete(upload.id).deleted
    with pytest.raises(NotFoundError):
        client.files.retrieve(upload.id)
    assert upload.id not in {f.id for f in client.files.list()}
    assert client.batches.retrieve(batch.id).output_file_id == batch.output_file_id

    with pytest.raises(NotFoundError):
        client.batches.create(
            input_file_id=f"file-{'0' * 32}", endpoint="/v1/embeddings", completion_window="24h"
        )
    with pytest.raises(BadRequestError):
        client.files.create(file=("x.jsonl", source), purpose="fine-tune")
    with pytest.raises(NotFoundError):
        client.files.content(f"file-{'0' * 32}")


def test_a_batch_names_its_lines_once(base_url: str, minilm_worker: int) -> None:
    """An `endpoint` binds every line to it; a file id comes alone, not beside a file."""
    source = _source().encode()
    created = _create(base_url, source, endpoint="/v1/jobs")
    errors = _jsonl(base_url, _wait_ended(base_url, created["id"])["id"], "errors")
    assert created["endpoint"] == "/v1/jobs"
    assert {e["error"]["type"] for e in errors} == {"url_mismatch", "invalid_request"}
    both = httpx.post(
        f"{base_url}/v1/batches",
        files={"file": ("b.jsonl", source)},
        data={"input_file_id": f"file-{'0' * 32}"},
        timeout=30,
    )
    assert both.status_code == 422 and "input_file_id" in both.json()["error"]["message"]
    empty = httpx.post(
        f"{base_url}/v1/files", files={"file": ("e.jsonl", b"\n")}, data={"purpose": "batch"}
    )
    assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]


def test_lines_a_cancel_stopped_carry_openais_batch_cancelled(
    base_url: str, minilm_worker: int
) -> None:
    source = "\n".join(
        _line(f"c{i}", {"model": "minilm", "input": TEXTS[i % len(TEXTS)]}) for i in range(600)
    )
    created = _create(base_url, source + "\n")
    cancelled = httpx.post(f"{base_url}/v1/batches/{created['id']}/cancel", timeout=30)
    assert cancelled.status_code == 200, cancelled.text
    errors = _jsonl(base_url, created["id"], "errors")
    assert errors, "the cancel came after every line had run"
    for error in errors:
        assert (error["status"], error["response"]) == ("cancelled", None), error
        assert error["error"]["code"] == "batch_cancelled" and error["id"], error


def test_a_failed_job_answers_in_the_errors_file_as_its_route_would() -> None:
    """A job the model failed on: the status `/predict` answers (422), its error as the body."""
    raised = b'{"type": "ValueError", "message": "no tokens"}'
    line = _openai_error(_error(ItemState("j1", "failed", "a", 3, None, raised)), EMBEDDINGS)
    error = {"type": "ValueError", "message": "no tokens", "code": "ValueError"}
    assert line["error"] == error and (line["id"], line["line"]) == ("j1", 3)
    assert line["response"] == {"status_code": 422, "request_id": "j1", "body": {"error": error}}
    expired = _openai_error(_error(ItemState("j2", None, "b", 4, None, None)), EMBEDDINGS)
    assert (expired["response"], expired["error"]["code"]) == (None, "batch_expired")


USAGE_OF_3 = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


def test_a_generate_jobs_outputs_are_what_a_completion_reads() -> None:
    outputs = {"text": "Paris", "finish_reason": "stop", "usage": USAGE_OF_3}
    assert generation_of("m", outputs) == Generation("Paris", "stop", USAGE_OF_3)


@pytest.mark.parametrize(
    "outputs",
    [
        None,
        [1],
        {"text": "x"},
        {"usage": USAGE_OF_3},
        {"text": 1, "usage": USAGE_OF_3},
        {"text": "x", "usage": {"prompt_tokens": 1}},
        {"text": "x", "usage": USAGE_OF_3, "finish_reason": 1},
    ],
)
def test_other_outputs_of_a_generate_job_are_a_bad_gateway(outputs: Any) -> None:
    """In a batch's output file such a line answers 502, as the route would."""
    with pytest.raises(ConveyorError) as refused:
        generation_of("odd", outputs)
    assert (refused.value.status, refused.value.type) == (502, "bad_model_output")


class _LaneFillsMeanwhile(JobStore):
    """The producer's job store, as another submit fills the bulk lane between a batch's room
    check and its enqueue: one job more, just before the batch's."""

    async def create_many(self, jobs: Sequence[NewJob], max_length: int = 0) -> list[int]:
        rival = RequestEntry(new_job_id("tight", "default"), {"inputs": {}}, now_ms())
        assert await super().create_many([NewJob(rival, jobs[0].stream, {})], max_length) == []
        return await super().create_many(jobs, max_length)


def test_batch_items_count_as_bulk_submits_and_one_a_full_lane_refused_is_held(
    redis_url: str, tmp_path: Path
) -> None:
    """Batch API items went uncounted: 2 of 3 lines enqueued read as no submit at all. The one
    the lane, filled meanwhile, refused is held for the sweeper to feed (it was an invalid
    line, a `queue_full` rejection): no rejection, not yet a submit."""
    (tmp_path / "tight").mkdir()
    (tmp_path / "tight" / "config.yaml").write_text(
        "kind: batch\nbackend: identity\ninput_schema: {type: object}\nqueue: {max_length: 3}\n"
    )
    settings = Settings(
        redis_url=redis_url, key_prefix="bm:", auth="disabled", model_repository=tmp_path
    )
    app = create_app(settings)
    source = "".join(_line(f"c{n}", {"inputs": {"n": n}}, url="/v1/jobs") + "\n" for n in range(3))
    part = {"model": "tight", "variant": "default"}
    with TestClient(app, base_url="http://localhost") as client:
        state: ProducerState = app.state.conveyor
        store = _LaneFillsMeanwhile(state.job_store.redis, state.keys, settings.result_ttl_s)
        app.state.conveyor = replace(state, job_store=store)
        before = _scraped(client)
        response = client.post(
            "/v1/batches",
            params={"model": "tight"},
            content=source,
            headers={"Content-Type": "application/jsonl"},
        )
        after = _scraped(client)
    assert response.status_code == 202, response.text
    counts = response.json()["counts"]
    assert (counts["invalid"], counts["pending"]) == (0, 3)  # held: the lane was full

    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset({**part, **labels}.items()))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("conveyor_jobs_submitted_total", lane="bulk") == 2
    assert delta("conveyor_jobs_rejected_total", reason="queue_full") == 0


def _scraped(client: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
    }

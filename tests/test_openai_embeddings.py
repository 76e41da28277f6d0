"""OpenAI's `/v1/embeddings` on the real pipeline (producer, Celery worker, embedded Valkey, minilm
on ONNX Runtime): the official `openai` client unchanged, both encodings, OpenAI's usage, the
refusals, and a client that leaves cancelling its job."""

from __future__ import annotations

import base64
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from conveyor.stack import Stack, free_port
from producer_api.errors import ConveyorError
from producer_api.openai.embedding_serving import embedding_list
from shared.codec import as_written, dumps, loads
from shared.keys import Keys
from shared.model_repository import ModelConfig
from tests.conftest import REPO_ROOT, ended, until
from tests.minilm_reference import (
    SENTENCES,
    assert_usage_counts_tokens,
    cosines,
    reference_embeddings,
)

KEYS = Keys("cv:")
# The stopped producer's CONVEYOR_STREAM_SHUTDOWN_GRACE_S (default 3 s): after how long its
# waiting requests answer.
STREAM_GRACE_S = 1.0


def _embed(base_url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/embeddings", json={"model": "minilm", **body}, timeout=60)


def test_the_official_client_gets_the_reference_vectors_and_usage(
    base_url: str, minilm_worker: int
) -> None:
    """Left to itself the client asks for base64 and decodes it; asked for floats, it gets
    numbers. Both give the reference vectors, in input order, with OpenAI's usage."""
    from openai import OpenAI

    sent: list[dict[str, Any]] = []
    http = httpx.Client(event_hooks={"request": [lambda r: sent.append(loads(r.content))]})
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, http_client=http)
    # an empty text is refused, as OpenAI refuses it, and so is the last, past the model's
    # context (tests/test_openai_r41_long_inputs.py)
    texts = [s for s in SENTENCES[:-1] if s]
    expected = reference_embeddings(texts)
    for answer in (
        client.embeddings.create(model="minilm", input=texts),
        client.embeddings.create(model="minilm", input=texts, encoding_format="float"),
    ):
        assert answer.model == "minilm" and answer.object == "list"
        assert [item.index for item in answer.data] == list(range(len(texts)))
        got = np.array([item.embedding for item in answer.data])
        assert got.shape == (len(texts), 384)
        assert cosines(got, expected).min() >= 0.999
        usage = answer.usage.model_dump()
        assert_usage_counts_tokens([{"texts": texts}], [{"usage": usage}])
    assert [body["encoding_format"] for body in sent] == ["base64", "float"]


def test_the_model_list_says_which_models_embed(base_url: str) -> None:
    cards = httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"]
    tasks = {card["id"]: card["task"] for card in cards}
    assert tasks["minilm"] == "embed" and tasks["identity"] is None


def test_the_official_client_lists_and_retrieves_models(base_url: str) -> None:
    """`client.models.list()` and `client.models.retrieve()`, which LangChain and other OpenAI
    clients call to check a model before they use it; an unknown one raises NotFoundError."""
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    assert {model.id for model in client.models.list()} == {"identity", "minilm", "smollm2"}
    minilm = client.models.retrieve("minilm")
    assert (minilm.id, minilm.object, minilm.owned_by) == ("minilm", "model", "conveyor")
    config = REPO_ROOT / "model_repository" / "minilm" / "config.yaml"
    assert minilm.created == int(config.stat().st_mtime)  # strict clients require `created`
    assert minilm.model_extra is not None and minilm.model_extra["task"] == "embed"
    with pytest.raises(NotFoundError):
        client.models.retrieve("nope")


def test_one_text_as_base64_is_its_float32_bytes_and_the_job_is_on_record(
    base_url: str, minilm_worker: int
) -> None:
    floats = _embed(base_url, input="Paris is the capital of France.")
    packed = _embed(base_url, input=["Paris is the capital of France."], encoding_format="base64")
    assert floats.status_code == packed.status_code == 200, (floats.text, packed.text)
    [number_item] = floats.json()["data"]
    [text_item] = packed.json()["data"]
    assert number_item["object"] == "embedding" and len(number_item["embedding"]) == 384
    decoded = np.frombuffer(base64.b64decode(text_item["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, number_item["embedding"], atol=1e-6)
    job = httpx.get(f"{base_url}/v1/jobs/{packed.headers['X-Conveyor-Job-Id']}", timeout=30)
    assert job.json()["status"] == "succeeded" and job.json()["model"] == "minilm"


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "identity", "input": "x"}, 400, "does not embed text"),
        ({"model": "no-such-model", "input": "x"}, 404, "no-such-model"),
        ({"input": [[101, 2054, 102]]}, 400, "check_embedding_ctx_length=False"),
        ({"input": [1, 2, 3]}, 400, "token arrays are not taken"),
        ({"input": []}, 400, "input"),
        ({"input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
        ({"input": "x", "dimensions": 128}, 400, "whole vectors only"),
        ({"model": "nope", "input": "x", "dimensions": 8}, 404, "nope"),  # was the 400 above
        ({"input": ["x"] * 257}, 400, 'input: ["x",'),  # as sent, not the job's inputs.texts
    ],
)
def test_bad_requests_are_refused_and_enqueue_nothing(
    base_url: str, stack_redis: redis.Redis, body: dict[str, Any], status: int, needle: str
) -> None:
    before = stack_redis.xlen(KEYS.queue("minilm", "default"))
    refused = httpx.post(f"{base_url}/v1/embeddings", json={"model": "minilm", **body}, timeout=30)
    assert refused.status_code == status, refused.text
    assert needle in refused.json()["error"]["message"]
    assert stack_redis.xlen(KEYS.queue("minilm", "default")) == before


def test_a_client_that_stops_waiting_cancels_its_job(
    base_url: str, minilm_worker: int, stack_redis: redis.Redis
) -> None:
    """The worker is stopped, so the job waits; the client gives up, and the job is cancelled
    while it waits, not embedded for nobody once the worker runs again."""
    before = set(stack_redis.scan_iter("cv:job:*"))
    os.kill(minilm_worker, signal.SIGSTOP)
    try:
        with pytest.raises(httpx.ReadTimeout):  # httpx then closes the connection
            httpx.post(
                f"{base_url}/v1/embeddings",
                json={"model": "minilm", "input": "nobody waits for me"},
                timeout=httpx.Timeout(30, read=2),
            )
        (key,) = set(stack_redis.scan_iter("cv:job:*")) - before
        until(lambda: stack_redis.hget(key, "status") == "cancelled")
    finally:
        os.kill(minilm_worker, signal.SIGCONT)
    job_id = _job_id(str(key))
    job = httpx.get(f"{base_url}/v1/jobs/{job_id}", params={"wait": 30}, timeout=60).json()
    assert job["status"] == "cancelled" and "outputs" not in job


def test_a_job_cancelled_while_its_request_waits_answers_409(
    base_url: str, minilm_worker: int, stack_redis: redis.Redis
) -> None:
    """The request's job ends without succeeding (cancelled by another client while the worker
    is stopped): the request answers as `/predict` would, with OpenAI's error body, and tells
    OpenAI's SDK not to retry: it retries a 409 twice by default, each retry a new job, so the
    cancel did nothing for its users."""
    from openai import ConflictError, OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused")  # its default retries
    before = set(stack_redis.scan_iter("cv:job:*"))
    os.kill(minilm_worker, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            text = "cancelled before it runs"
            waiting = pool.submit(client.embeddings.create, model="minilm", input=text)
            made = until(lambda: set(stack_redis.scan_iter("cv:job:*")) - before)
            job_id = _job_id(next(iter(made)))
            cancelled = httpx.delete(f"{base_url}/v1/jobs/{job_id}", timeout=30)
            assert cancelled.status_code == 200, cancelled.text
            with pytest.raises(ConflictError) as refused:
                waiting.result(timeout=60)
    finally:
        os.kill(minilm_worker, signal.SIGCONT)
    answer = refused.value.response
    assert answer.headers["x-should-retry"] == "false", answer.headers
    error = answer.json()["error"]
    assert error["type"] == "cancelled" and job_id in error["message"]
    assert set(stack_redis.scan_iter("cv:job:*")) - before == made  # no job but the first


def test_a_producer_asked_to_stop_answers_a_waiting_embeddings_request(
    stack: Stack, minilm_worker: int, stack_redis: redis.Redis
) -> None:
    """The request waits in long polls; once the producer was asked to stop each poll came
    back at once, and the request spun, reading its job, for as long as the job waited (here
    its worker is stopped): the producer never exited. It answers 503 naming the job, as a
    non-streamed completion does, and the job runs on."""
    name = "doomed-embeddings"
    grace = {"CONVEYOR_STREAM_SHUTDOWN_GRACE_S": str(STREAM_GRACE_S)}
    doomed = stack.start_producer(free_port(), name=name, **grace)
    before = set(stack_redis.scan_iter("cv:job:*"))
    os.kill(minilm_worker, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_embed, doomed, input="asked while the producer stops")
            until(lambda: set(stack_redis.scan_iter("cv:job:*")) - before)
            began = time.monotonic()
            exit_code = stack.stop_process(name, timeout=60)
            stopped_s = time.monotonic() - began
            answer = waiting.result(timeout=60)
    finally:
        os.kill(minilm_worker, signal.SIGCONT)
    assert exit_code in (0, -signal.SIGTERM) and stopped_s < STREAM_GRACE_S + 7, stopped_s
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "1", answer.text
    job_id = answer.json()["error"]["job"]
    # over as many long polls as it takes: the worker, thawed, reconnects before it runs it
    view = ended(f"{stack.base_url}/v1/jobs/{job_id}")
    assert view["status"] == "succeeded", view


def _job_id(key: str) -> str:
    return key.removeprefix("cv:job:").translate(str.maketrans("", "", "{}"))


def test_only_a_batch_model_may_embed() -> None:
    """`task: embed` names what `/v1/embeddings` may run: a micro-batching encoder."""
    with pytest.raises(ValueError, match="task embed needs kind batch"):
        ModelConfig.model_validate(
            {"name": "chat", "kind": "generate", "task": "embed", "backend": "vllm"}
        )
    encoder = {"name": "enc", "kind": "batch", "task": "embed", "backend": "onnxruntime"}
    assert ModelConfig.model_validate(encoder).task == "embed"


BAD_OUTPUTS = [
    {"embeddings": [[0.5]]},
    {"usage": {}},
    [[0.5]],
    None,
    {"embeddings": 5, "usage": {}},
]


@pytest.mark.parametrize("outputs", BAD_OUTPUTS)
def test_outputs_unlike_an_embedders_are_a_bad_gateway(outputs: Any) -> None:
    with pytest.raises(ConveyorError) as refused:
        embedding_list("odd", outputs)
    assert (refused.value.status, refused.value.type) == (502, "bad_model_output")


@pytest.mark.parametrize("outputs", BAD_OUTPUTS)
def test_outputs_unlike_an_embedders_are_a_bad_gateway_as_written_too(outputs: Any) -> None:
    with pytest.raises(ConveyorError) as refused:
        embedding_list("odd", as_written(dumps(outputs)))
    assert (refused.value.status, refused.value.type) == (502, "bad_model_output")


USAGE = '"usage":{"prompt_tokens":3,"total_tokens":3}'


def test_vectors_as_the_worker_wrote_them_go_out_as_written() -> None:
    """`0.50` and `1E2` would come out of a parse and a write as `0.5` and `100.0`."""
    written = f'{{"embeddings":[[0.50,1E2],[],[-3]],{USAGE}}}'
    answer = dumps(embedding_list("m", as_written(written))).decode()
    assert '"embedding":[0.50,1E2]' in answer and '"embedding":[]' in answer
    assert loads(answer) == embedding_list("m", loads(written))


@pytest.mark.parametrize(
    "written",
    [
        f'{{"embeddings": [[0.5], [1.5]], {USAGE}}}',  # spaced
        f'{{{USAGE},"embeddings":[[0.5],[1.5]]}}',  # usage first
        f'{{"embeddings":["AAAAPw==","AADAPw=="],{USAGE}}}',  # base64
        f'{{"embeddings":[[[0.5]],[[1.5]]],{USAGE}}}',  # nested deeper
        f'{{"embeddings":[[0.5,[1.5]]],{USAGE}}}',
        f'{{"embeddings":[[0.5],"],[",[1.5]],{USAGE}}}',  # a separator inside a string
        f'{{"embeddings":[[{{"a":1}}],[1.5]],{USAGE}}}',
        f'{{"embeddings":[],{USAGE}}}',
    ],
)
def test_outputs_in_any_other_shape_are_read_as_json(written: str) -> None:
    answer = embedding_list("m", as_written(written))
    assert loads(dumps(answer)) == embedding_list("m", loads(written))

"""A text longer than the model reads (`max_seq_length`, minilm's 256 tokens) on OpenAI's
embeddings route is refused as OpenAI's and vLLM's servers refuse it: 400, vLLM's message word for
word ("This model's maximum context length is 256 tokens. However, you requested M tokens in the
input for embedding generation. ..."), which clients match. It was embedded from its first 256
tokens, silently. The route's job asks for that (`parameters.truncate: false`); the worker's
encoder, which tokenises anyway, fails that job alone (`ContextLengthExceeded`), every other job
of its micro-batch embedded. `/v1/jobs` still truncates; a Batch API line answers 400 as its
route does, the other lines unaffected. Real minilm on ONNX Runtime (and PyTorch's padding of a
call to its graph's rows), real Valkey, a real worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

from producer_api.batch_api.protocol import CHAT, EMBEDDINGS
from producer_api.batch_api.serving import _error, _openai_error
from shared.batch_api_store import ItemState
from shared.generate_errors import ContextLengthExceeded
from shared.job_parameters import ParametersRefused, check_parameters
from tests.minilm_reference import (
    MAX_SEQ_LENGTH,
    cosines,
    minilm_config,
    prepared_artifacts,
    reference_embeddings,
)
from tests.test_batches import _create, _jsonl, _wait_ended
from workers.batching.micro_batch_executor import engine_calls, execute
from workers.batching.micro_batch_loop import engine_item
from workers.engines.onnxruntime_engine import OnnxRuntimeEngine
from workers.engines.text_encoding import TOKENIZER_FILE, TextEncoder
from workers.engines.torch_engine import pad_rows

# Each "word" one token: 2 special tokens besides, so 254 of them fill the context exactly.
FITS = " ".join(["word"] * (MAX_SEQ_LENGTH - 2))
ONE_OVER = " ".join(["word"] * (MAX_SEQ_LENGTH - 1))
LONG = "The queue holds every request until a worker is free. " * 40
SHORT = ["Paris is the capital of France.", "A worker pulls micro-batches."]
REFUSE = {"truncate": False}  # what the OpenAI route's job asks


def _refusal(tokens: int) -> str:
    return (
        f"This model's maximum context length is {MAX_SEQ_LENGTH} tokens. However, you requested "
        f"{tokens} tokens in the input for embedding generation. Please reduce the length of "
        "the input."
    )


def _whole_tokens(text: str) -> int:
    """The text's tokens, special ones included, untruncated (the model's own tokenizer)."""
    tokenizer = Tokenizer.from_file(str(prepared_artifacts() / TOKENIZER_FILE))
    tokenizer.no_truncation()
    tokenizer.no_padding()  # its tokenizer.json pads to 128
    return len(tokenizer.encode(text).ids)


@pytest.fixture(scope="module")
def engine() -> OnnxRuntimeEngine:
    engine = OnnxRuntimeEngine(minilm_config(), "default", str(prepared_artifacts()))
    engine.load()
    return engine


def test_the_message_is_vllms_word_for_word() -> None:
    assert str(ContextLengthExceeded(300, 256, embedding=True)) == _refusal(300)


async def test_a_too_long_text_fails_its_job_alone_in_its_micro_batch(
    engine: OnnxRuntimeEngine,
) -> None:
    """One micro-batch: jobs that refuse a cut text (as the OpenAI route's do) beside one that
    does not (as `/v1/jobs`'s). The refusing jobs with a text past the context fail, each with
    vLLM's message and its own token count; every other job gets its vectors, the native one
    its first 256 tokens'; a text of exactly 256 tokens is no text cut."""
    jobs: list[dict[str, Any]] = [
        {"inputs": {"texts": SHORT}, "parameters": REFUSE},
        {"inputs": {"texts": [SHORT[0], LONG]}, "parameters": REFUSE},
        {"inputs": {"texts": [LONG]}},  # /v1/jobs: truncated
        {"inputs": {"texts": [FITS]}, "parameters": REFUSE},
        {"inputs": {"texts": [ONE_OVER]}, "parameters": REFUSE},
        {"inputs": {"texts": [SHORT[1]], "encoding_format": "base64"}, "parameters": REFUSE},
    ]
    outcomes = await execute(engine, [engine_item(job) for job in jobs])

    # one engine call served them all: raising failed the call, whose bisection made it 6
    assert len(engine_calls(outcomes)) == 1
    failed = {i: o.error for i, o in enumerate(outcomes) if o.error is not None}
    assert failed == {
        1: {"type": "ContextLengthExceeded", "message": _refusal(_whole_tokens(LONG))},
        4: {"type": "ContextLengthExceeded", "message": _refusal(MAX_SEQ_LENGTH + 1)},
    }
    assert _whole_tokens(LONG) > MAX_SEQ_LENGTH and _whole_tokens(FITS) == MAX_SEQ_LENGTH
    out = [o.output for o in outcomes]
    assert out[2] is not None and out[3] is not None and out[0] is not None
    assert out[2]["usage"]["prompt_tokens"] == out[3]["usage"]["prompt_tokens"] == MAX_SEQ_LENGTH
    got = np.array([*out[0]["embeddings"], *out[3]["embeddings"]])
    assert cosines(got, reference_embeddings([*SHORT, FITS])).min() >= 0.999
    assert cosines(np.array(out[2]["embeddings"]), reference_embeddings([LONG])).min() >= 0.999
    assert out[5] is not None and isinstance(out[5]["embeddings"][0], str)


def test_pytorchs_padded_call_keeps_which_texts_were_cut() -> None:
    """A call padded to its CUDA graph's rows still says which of its texts truncation cut:
    else a refusing job's text past the context was embedded cut on the `torch` variant."""
    encoder = TextEncoder.from_artifacts(prepared_artifacts(), MAX_SEQ_LENGTH)
    batch = encoder.tokenize([SHORT[0], LONG], widths=[32, 256])
    padded = pad_rows(batch, 8).at_limit
    assert [padded.whole_tokens(row) for row in range(8)] == [None, _whole_tokens(LONG)] + [
        None
    ] * 6


def test_an_embed_models_job_takes_truncate_alone_as_a_boolean() -> None:
    config = minilm_config()
    check_parameters(config, "default", {"truncate": False})
    check_parameters(config, "default", {"truncate": True})
    with pytest.raises(ParametersRefused, match=r"^parameters.truncate: must be a boolean$"):
        check_parameters(config, "default", {"truncate": "no"})
    with pytest.raises(ParametersRefused, match="normalize: model minilm takes no job param"):
        check_parameters(config, "default", {"normalize": False, "truncate": False})


def test_a_failed_lines_context_refusal_is_its_routes_400_in_the_errors_file() -> None:
    """As the route answers it: 400, OpenAI's `invalid_request_error` naming the input's field,
    vLLM's message; it was the failed job's 422. Other failures keep their 422."""
    raised = json.dumps({"type": "ContextLengthExceeded", "message": _refusal(300)}).encode()
    for endpoint, param in ((EMBEDDINGS, "input"), (CHAT, "messages")):
        item = ItemState("j1", "failed", "a", 3, None, raised)
        line = _openai_error(_error(item), endpoint=endpoint)
        assert line["response"]["status_code"] == 400, line
        body = line["response"]["body"]["error"]
        assert (body["type"], body["param"], body["message"]) == (
            "invalid_request_error",
            param,
            _refusal(300),
        )
        assert line["error"]["type"] == "ContextLengthExceeded"


@pytest.mark.slow
def test_the_route_answers_400_and_jobs_still_truncate(base_url: str, minilm_worker: int) -> None:
    """On the real pipeline: the official client gets BadRequestError with vLLM's message, for
    a text alone or among others; `/v1/jobs` embeds the same text's first 256 tokens, unless its
    job asks otherwise."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    for sent in (LONG, [SHORT[0], LONG]):
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model="minilm", input=sent)
        error = refused.value
        assert (error.status_code, error.type, error.param) == (
            400,
            "invalid_request_error",
            "input",
        )
        assert error.body["message"] == _refusal(_whole_tokens(LONG))  # type: ignore[index]
    fits = client.embeddings.create(model="minilm", input=[FITS, SHORT[0]])
    assert fits.usage.prompt_tokens == MAX_SEQ_LENGTH + _whole_tokens(SHORT[0])

    predict = f"{base_url}/v1/models/minilm/predict"
    job = httpx.post(predict, json={"inputs": {"texts": [LONG]}}, timeout=60).json()
    assert job["status"] == "succeeded", job
    assert job["outputs"]["usage"]["prompt_tokens"] == MAX_SEQ_LENGTH
    # a native job may refuse as well: the model failed on it, as `/predict` answers that
    whole = {"inputs": {"texts": [LONG]}, "parameters": REFUSE}
    refused = httpx.post(predict, json=whole, timeout=60)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["type"] == "ContextLengthExceeded", refused.text


@pytest.mark.slow
def test_a_batch_answers_the_too_long_line_400_and_the_others_200(
    base_url: str, minilm_worker: int, tmp_path: Path
) -> None:
    lines = [
        {"custom_id": cid, "method": "POST", "url": "/v1/embeddings", "body": body}
        for cid, body in (
            ("short", {"model": "minilm", "input": SHORT}),
            ("long", {"model": "minilm", "input": [SHORT[0], LONG]}),
            ("fits", {"model": "minilm", "input": FITS}),
        )
    ]
    created = _create(base_url, "\n".join(json.dumps(line) for line in lines) + "\n")
    batch = _wait_ended(base_url, created["id"])
    assert batch["status"] == "completed", batch
    outputs = _jsonl(base_url, batch["id"], "output")
    assert [(o["custom_id"], o["response"]["status_code"]) for o in outputs] == [
        ("short", 200),
        ("fits", 200),
    ]
    [error] = _jsonl(base_url, batch["id"], "errors")
    assert (error["custom_id"], error["status"]) == ("long", "failed"), error
    assert error["response"]["status_code"] == 400, error
    body = error["response"]["body"]["error"]
    assert (body["type"], body["param"]) == ("invalid_request_error", "input"), error
    assert body["message"] == _refusal(_whole_tokens(LONG))

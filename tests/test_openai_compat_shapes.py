"""OpenAI's response shapes field by field, from the real SmolLM2 worker (vLLM's CPU build): a
whole chat completion, a chat stream with and without `stream_options.include_usage`, and a
completion stream cut by a stop string that spans the engine's steps. Few, short generations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import BadRequestError, OpenAI

from conveyor.stack import Stack
from shared.codec import loads

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the worker's engine starts slowly
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def llm(stack: Stack, smollm2_worker: None) -> str:
    return stack.base_url


def _post(base_url: str, path: str, **body: Any) -> httpx.Response:
    body = {"model": "smollm2", "temperature": 0, **body}
    return httpx.post(f"{base_url}{path}", json=body, timeout=300)


def _chunks(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a stream, which must end with `data: [DONE]`."""
    datas = [line.removeprefix("data: ") for line in response.iter_lines() if line[:5] == "data:"]
    assert datas[-1] == "[DONE]", datas
    return (loads(data) for data in datas[:-1])


def _stream(base_url: str, path: str, **body: Any) -> list[dict[str, Any]]:
    with httpx.stream(
        "POST",
        f"{base_url}{path}",
        json={"model": "smollm2", "temperature": 0, "stream": True, **body},
        timeout=300,
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(_chunks(response))


def _usage_sums(usage: dict[str, int]) -> bool:
    return usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"]


def test_a_whole_chat_completion_has_openais_fields(llm: str) -> None:
    response = _post(llm, "/v1/chat/completions", messages=MESSAGES, max_completion_tokens=3)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}, body
    assert body["id"] == f"chatcmpl-{response.headers['x-conveyor-job-id']}"
    assert (body["object"], body["model"]) == ("chat.completion", "smollm2")
    assert isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"  # 3 tokens do not finish the answer
    assert body["usage"]["completion_tokens"] == 3 and _usage_sums(body["usage"])


def test_a_chat_stream_with_and_without_the_usage_chunk(llm: str) -> None:
    """Every chunk has the stream's one id and `created`; with `include_usage`, every chunk has
    `usage: null` but the last, which has no choices; without it, no chunk has `usage`."""
    for include_usage in (True, False):
        asked = {"stream_options": {"include_usage": True}} if include_usage else {}
        chunks = _stream(llm, "/v1/chat/completions", messages=MESSAGES, max_tokens=3, **asked)
        assert len({(c["id"], c["created"]) for c in chunks}) == 1, chunks
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        if include_usage:
            *chunks, last = chunks
            assert last["choices"] == [] and _usage_sums(last["usage"]), last
            assert last["usage"]["completion_tokens"] == 3
            assert all("usage" in c and c["usage"] is None for c in chunks), chunks
        else:
            assert not any("usage" in c for c in chunks), chunks
        *texts, closing = [c["choices"][0] for c in chunks]
        assert all(t["finish_reason"] is None and t["index"] == 0 for t in texts)
        assert closing["finish_reason"] == "length" and closing["delta"] == {}


def test_a_completion_stream_stops_before_a_stop_string_that_spans_steps(llm: str) -> None:
    """No part of the stop string reaches the client, in whichever chunks it was generated."""
    whole = _post(llm, "/v1/completions", prompt=PROMPT, max_tokens=12).json()
    text = whole["choices"][0]["text"]
    words = text.split(" ")
    assert len(words) >= 5, text
    stop = " ".join(words[2:4])  # two words, so more than one token, hence more than one step
    chunks = _stream(llm, "/v1/completions", prompt=PROMPT, max_tokens=12, stop=[stop])
    assert all(c["object"] == "text_completion" for c in chunks)
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert streamed == text[: text.index(stop)], (streamed, text, stop)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def _client(base_url: str) -> OpenAI:
    return OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_the_official_client_reads_the_stream_to_its_end(llm: str) -> None:
    stream = _client(llm).completions.create(
        model="smollm2",
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert chunks[-2].choices[0].finish_reason == "length"


def test_echo_puts_the_prompt_before_the_completion_whole_and_streamed(llm: str) -> None:
    """As vLLM's server echoes it (it was refused, 400); the usage is the generation's."""
    client = _client(llm)
    asked: dict[str, Any] = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 2, "echo": True}
    whole = client.completions.create(**asked, temperature=0)
    chunks = list(client.completions.create(**asked, temperature=0, stream=True))
    text = whole.choices[0].text
    assert text.startswith(PROMPT) and len(text) > len(PROMPT), text
    assert "".join(c.choices[0].text for c in chunks) == text, chunks
    assert whole.usage is not None and whole.usage.completion_tokens == 2


def test_the_sdks_request_id_is_the_job_id_whole_and_streamed(llm: str) -> None:
    """OpenAI's SDK reads `x-request-id` as `_request_id`; it was None."""
    client = _client(llm)
    asked: dict[str, Any] = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 1}
    whole = client.completions.with_raw_response.create(**asked)
    assert whole.parse()._request_id == whole.headers["x-conveyor-job-id"]
    with client.completions.create(**asked, stream=True) as stream:
        headers = stream.response.headers
        assert headers["x-request-id"] == headers["x-conveyor-job-id"]


def test_a_prompt_past_the_context_is_openais_400_saying_both_lengths(llm: str) -> None:
    """As vLLM's server refuses it: 400 `invalid_request_error` naming the prompt's field,
    saying the context's length and the prompt's, which OpenAI's SDK raises as BadRequestError.
    It was the failed job's 422 (`ValueError`), UnprocessableEntityError to the SDK. Streamed,
    the same 400 before any stream opens, as vLLM's server answers: it was a 200 stream whose
    one chunk was the error, which OpenAI's SDK raised as a bare APIError mid-iteration."""
    words = "hello " * 2100  # within the input schema's 16000 characters, past 2048 tokens
    chat = {"messages": [{"role": "user", "content": words}]}
    said = "This model's maximum context length is 2048 tokens. However, your prompt contains "
    for path, asked, param in [
        ("/v1/chat/completions", chat, "messages"),
        ("/v1/completions", {"prompt": words}, "prompt"),
    ]:
        response = _post(llm, path, **asked)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param), error
        assert error["message"].startswith(said), error
    streamed = _post(llm, "/v1/chat/completions", **chat, stream=True)
    assert streamed.status_code == 400, streamed.text
    assert streamed.json()["error"]["message"].startswith(said), streamed.text
    with pytest.raises(BadRequestError, match="maximum context length"):
        _client(llm).chat.completions.create(model="smollm2", stream=True, **chat)
    failed = httpx.post(f"{llm}/v1/models/smollm2/predict", json={"inputs": {"prompt": words}})
    assert failed.status_code == 422, failed.text
    job_id = failed.json()["error"]["message"].split()[1]  # "job <id> failed: ..."
    job = httpx.get(f"{llm}/v1/jobs/{job_id}", timeout=30).json()
    assert job["prompt_tokens"] == 2101, job  # what it read of its prompt: its usage said 0

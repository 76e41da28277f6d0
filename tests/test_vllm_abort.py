"""`VllmEngine.abort` ends a request's chunks whatever the vLLM release does with an aborted
request. Before vLLM's PR #22283 (August 2025), AsyncLLM.abort freed the request but sent no
last output: its `generate` iterator waited for ever, and so did the job's slot and the worker's
drain on SIGTERM. The AsyncLLM here is a stand-in for that third-party behaviour (and for the
newer one), so this runs without vLLM: everything of Conveyor's is real."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.model_repository import ModelConfig
from workers.engines.base import TokenChunk
from workers.engines.vllm_engine import VllmEngine

CONFIG = ModelConfig(name="abort-me", kind="generate", backend="vllm")
HANG_GUARD_S = 30  # only against a hang: the abort ends the chunks at once


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class Output:
    outputs: list[Completion]
    finished: bool = False


@dataclass
class StandInAsyncLLM:
    """vLLM's AsyncLLM as Conveyor drives it: one step of text, then outputs only as its
    queue gets them. `final_abort_output`: abort puts a last finished output there (vLLM since
    PR #22283); else abort puts nothing, and `generate` waits for ever (vLLM before it)."""

    final_abort_output: bool
    queue: asyncio.Queue[Output] = field(default_factory=asyncio.Queue)
    aborted: list[str] = field(default_factory=list)

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Output]:
        yield Output([Completion("Once upon", [1, 2])])
        while True:
            output = await self.queue.get()
            yield output
            if output.finished:
                return

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        if self.final_abort_output:
            self.queue.put_nowait(Output([Completion("", [], "abort")], finished=True))


@pytest.mark.parametrize("final_abort_output", [False, True], ids=["no-last-output", "last-output"])
async def test_abort_ends_the_chunks_with_one_abort_chunk(final_abort_output: bool) -> None:
    vllm = StandInAsyncLLM(final_abort_output)
    engine = VllmEngine.around(vllm, CONFIG, "default")  # type: ignore[arg-type]
    chunks: list[TokenChunk] = []
    stream = vllm.generate(None, None, "job-1")
    async with asyncio.timeout(HANG_GUARD_S):
        async for chunk in engine.chunks(stream, "job-1", prompt_tokens=5):
            chunks.append(chunk)
            if len(chunks) == 1:
                await engine.abort("job-1")
    assert vllm.aborted == ["job-1"]
    assert [c.finish_reason for c in chunks] == [None, "abort"]  # not doubled either
    assert chunks[-1].prompt_tokens == 5 and chunks[-1].completion_tokens == 2

"""Part C bounds each generation: a stalled engine or a lost job fails the part, naming the
generation, instead of hanging the benchmark (and the smoke test) for good."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks import llm_streaming
from benchmarks.llm_streaming import Stream, with_deadline


async def test_a_generation_that_never_ends_fails_with_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(llm_streaming, "GENERATION_TIMEOUT_S", 0.05)

    async def stalled(index: int) -> Stream:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    with pytest.raises(RuntimeError, match=r"^pipeline \(SSE\): generation 3 had not ended"):
        await with_deadline(llm_streaming.PIPELINE, stalled)(3)


async def test_a_generation_that_ends_is_passed_through() -> None:
    async def quick(index: int) -> Stream:
        return Stream(0.01, 0.02, index)

    assert await with_deadline(llm_streaming.ENGINE, quick)(7) == Stream(0.01, 0.02, 7)

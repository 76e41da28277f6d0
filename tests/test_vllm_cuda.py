"""The `vllm` engine on a CUDA GPU with the CUDA build of vLLM and its usual GPU settings (bf16,
CUDA graphs): it must stream, batch continuously and abort there as it does on the CPU."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.model_repository import ModelConfig
from tests.conftest import started_vllm
from tests.gpu_requirements import needs_gpu
from tests.test_llm_engine import PARIS, QUESTIONS, STORY, collect, greedy, text_of
from workers.engines.vllm_engine import VllmEngine

GPU_PARAMETERS = {"dtype": "bfloat16", "enforce_eager": False, "gpu_memory_utilization": 0.3}


pytestmark = [
    pytest.mark.gpu,
    needs_gpu("torch", "vllm"),
]


@pytest.fixture(scope="module")
async def cuda_engine(
    smollm2_config: ModelConfig, smollm2_artifacts: Path
) -> AsyncIterator[VllmEngine]:
    parameters = {**smollm2_config.parameters, **GPU_PARAMETERS}
    config = smollm2_config.model_copy(update={"parameters": parameters})
    engine = await started_vllm(config, smollm2_artifacts)
    yield engine
    await engine.close()


async def test_engine_streams_on_cuda(cuda_engine: VllmEngine) -> None:
    assert cuda_engine.device_type == "cuda"
    chunks = await collect(cuda_engine, greedy("cuda-paris", PARIS, 48))
    assert len(chunks) > 2
    assert chunks[-1].finish_reason in {"stop", "length"}
    assert text_of(chunks).strip()


async def test_eight_concurrent_streams_batch_on_cuda(cuda_engine: VllmEngine) -> None:
    cuda_engine.step_stats.reset()
    requests = [
        greedy(f"cuda-{i}", [{"role": "user", "content": q}], 32) for i, q in enumerate(QUESTIONS)
    ]
    results = await asyncio.gather(*(collect(cuda_engine, r) for r in requests))
    assert all(chunks[-1].finish_reason in {"stop", "length"} for chunks in results)
    assert cuda_engine.step_stats.max_running == len(QUESTIONS), cuda_engine.step_stats


async def test_abort_on_cuda_frees_slot(cuda_engine: VllmEngine) -> None:
    stream = cuda_engine.generate(greedy("cuda-abort", STORY, 1000))
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 3:
            await cuda_engine.abort("cuda-abort")
    assert chunks[-1].finish_reason == "abort"
    cuda_engine.step_stats.reset()
    await collect(cuda_engine, greedy("cuda-after-abort", PARIS, 8))
    assert cuda_engine.step_stats.max_running == 1

"""A generate model's `max_tokens_limit: null` (a variant lifting its model's limit, or a config
that leaves it empty) is no limit, as the repository loads it and the producer reads it: the
worker took `int(None)` and failed every job, and the backlog's estimate raised."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_repository import UNNAMED_MAX_TOKENS, ModelConfig, ModelRepository
from workers.engines.base import GenerateRequest
from workers.engines.vllm_engine import VllmEngine
from workers.generation.generate_job import generate_request

# The model's limit, lifted by its variant.
UNLIMITED = (
    "kind: generate\nbackend: vllm\nparameters: {max_tokens_limit: 64}\n"
    "variants: {default: {parameters: {max_tokens_limit: null}}}\n"
)


def unlimited(tmp_path: Path) -> ModelConfig:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.yaml").write_text(UNLIMITED)
    config = ModelRepository.load(tmp_path).get("m")
    assert config is not None
    return config


def test_a_job_naming_no_max_tokens_runs_with_the_unnamed_default(tmp_path: Path) -> None:
    config = unlimited(tmp_path)
    assert config.unnamed_max_tokens_of("default") == UNNAMED_MAX_TOKENS
    payload = {"inputs": {"prompt": "Hello"}}
    request = generate_request("j", payload, config.variant_parameters("default"))
    assert request.max_tokens == UNNAMED_MAX_TOKENS


@pytest.mark.slow
async def test_vllm_caps_max_tokens_at_the_context_alone(
    tmp_path: Path, smollm2_engine: VllmEngine
) -> None:
    engine = VllmEngine.around(smollm2_engine._running_engine(), unlimited(tmp_path), "default")
    request = GenerateRequest(request_id="j", prompt="Hello", max_tokens=100)
    assert engine.sampling_params(request, prompt_tokens=5).max_tokens == 100

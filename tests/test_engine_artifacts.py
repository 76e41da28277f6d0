"""A worker whose model files are missing fails at load with one error that names the files and
says how to get them, whatever its engine. The libraries' own errors said `No such file or
directory` and nothing more (the tokenizer's, which came first), or asked a model hub for the
folder (transformers')."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shared.model_repository import ModelConfig, ModelRepository
from tests.conftest import REPO_ROOT
from workers.engines.base import GenerateEngine, MissingArtifacts
from workers.engines.registry import create_engine

REPOSITORY = ModelRepository.load(REPO_ROOT / "model_repository")


def _load(config: ModelConfig, variant: str, root: Path) -> str:
    engine = create_engine(config, variant, root)
    with pytest.raises(MissingArtifacts) as missing:
        if isinstance(engine, GenerateEngine):
            asyncio.run(engine.load())
        else:
            engine.load()
    return str(missing.value)


@pytest.mark.parametrize(
    ("model", "variant", "files"),
    [
        ("minilm", "default", "tokenizer.json, model.onnx"),  # ONNX Runtime
        ("minilm", "torch", "config.json, model.safetensors, tokenizer.json"),  # PyTorch
        ("smollm2", "default", "config.json"),  # vLLM
    ],
)
def test_missing_files_are_named_with_the_command_that_builds_them(
    tmp_path: Path, model: str, variant: str, files: str
) -> None:
    config = REPOSITORY.get(model)
    assert config is not None
    message = _load(config, variant, tmp_path)
    folder = tmp_path / model
    assert message == (
        f"model {model}: {files} missing in {folder}; run `conveyor models prepare {model}`"
    )


def test_only_the_missing_file_is_named_and_a_model_without_a_recipe_says_where(
    tmp_path: Path,
) -> None:
    """A model of the user's own (no `prepare` recipe) cannot be built by the CLI."""
    config = ModelConfig.model_validate(
        {"name": "mine", "kind": "batch", "backend": "onnxruntime", "artifact": "net.onnx"}
    )
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "tokenizer.json").write_text("{}")
    assert _load(config, "default", tmp_path) == (
        f"model mine: net.onnx missing in {tmp_path / 'mine'}; put them there, or point "
        "CONVEYOR_ARTIFACT_DIR at their parent"
    )

"""config.yaml values that loaded and broke a worker later, now refused at load in one line
naming the file and the field: a `prepare` builder of the other kind than the model's engine
(an ONNX encoder for vLLM, a Hugging Face LLM folder for ONNX Runtime), a custom backend whose
module path no import finds (`pkg.:Engine`), and an `artifact` that names the folder itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_repository import ModelRepository
from tests.test_model_repo_r16_refusals import refusal


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            "kind: generate\nbackend: vllm\nprepare: minilm\n",
            "model m variant default: `prepare: minilm` builds a batch model, which backend "
            "vllm (kind generate) cannot load",
        ),
        (
            "kind: batch\nbackend: onnxruntime\nprepare: smollm2\n",
            "model m variant default: `prepare: smollm2` builds a generate model, which backend "
            "onnxruntime (kind batch) cannot load",
        ),
        (  # a variant on another engine is checked too
            "kind: batch\nbackend: identity\nprepare: smollm2\n"
            "variants: {default: {}, gpu: {weight: 0, backend: torch}}\n",
            "model m variant gpu: `prepare: smollm2` builds a generate model, which backend "
            "torch (kind batch) cannot load",
        ),
    ],
)
def test_a_preparer_of_the_other_kind_is_refused(tmp_path: Path, text: str, why: str) -> None:
    assert refusal(tmp_path, text) == f"{tmp_path / 'm' / 'config.yaml'}: {why}"


def test_a_preparer_of_the_models_kind_loads(tmp_path: Path) -> None:
    """minilm for an encoder, smollm2 for vLLM, and identity (which loads nothing) with either."""
    configs = {
        "enc": "kind: batch\nbackend: onnxruntime\nprepare: minilm\n",
        "llm": "kind: generate\nbackend: vllm\nprepare: smollm2\n",
        "echo": "kind: batch\nbackend: identity\nprepare: smollm2\n",
    }
    for name, text in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(text)
    assert {config.name for config in ModelRepository.load(tmp_path)} == set(configs)


@pytest.mark.parametrize("backend", ["pkg.:Engine", "pkg..engines:Engine", "pkg.engines.:Engine"])
def test_a_custom_backend_no_import_finds_is_refused(tmp_path: Path, backend: str) -> None:
    text = f"kind: batch\nbackend: '{backend}'\n"
    assert f"unknown backend {backend!r}" in refusal(tmp_path, text)


def test_a_dotted_custom_backend_loads(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text("kind: batch\nbackend: _pkg.engines.2x:Engine\n")
    assert ModelRepository.load(tmp_path).models["m"].backend == "_pkg.engines.2x:Engine"


@pytest.mark.parametrize("artifact", [".", "./"])
def test_an_artifact_naming_the_folder_itself_is_refused(tmp_path: Path, artifact: str) -> None:
    text = f"kind: batch\nbackend: onnxruntime\nartifact: '{artifact}'\n"
    assert refusal(tmp_path, text).startswith(
        f"{tmp_path / 'm' / 'config.yaml'}: artifact: {artifact!r} is not a file inside"
    )

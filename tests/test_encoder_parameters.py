"""An encoder model's `parameters` hold only what an encoder engine reads: a typo such as
`max_seq_lenght` loaded, and the engines served at their default length, silently. A variant
reads its model's parameters merged with its own, so its sibling engines' settings pass."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from shared.model_repository import (
    ENCODER_BACKENDS,
    ENGINE_SETTINGS,
    EncoderParameters,
    ModelConfigError,
    ModelRepository,
)
from workers.engines.registry import BACKENDS

# How the engines read a setting: `parameters.get("name"` or `_whole(parameters, "name"`.
READ = re.compile(r"parameters(?:\.get\(|, )\"(\w+)\"")


def _load(root: Path, text: str) -> ModelRepository:
    (root / "m").mkdir()
    (root / "m" / "config.yaml").write_text(text)
    return ModelRepository.load(root)


@pytest.mark.parametrize(
    ("text", "variant", "unknown"),
    [
        ("backend: onnxruntime\nparameters: {max_seq_lenght: 128}\n", "default", "max_seq_lenght"),
        (
            "backend: identity\nvariants: {default: {}, gpu: {backend: tensorrt, "
            "parameters: {precison: int8}}}\n",
            "gpu",
            "precison",
        ),
    ],
)
def test_a_setting_no_encoder_engine_reads_is_refused_by_name(
    tmp_path: Path, text: str, variant: str, unknown: str
) -> None:
    with pytest.raises(ModelConfigError) as refused:
        _load(tmp_path, f"kind: batch\n{text}")
    assert str(refused.value).startswith(
        f"{tmp_path / 'm' / 'config.yaml'}: model m variant {variant}: parameters: {unknown!r} is "
        "read by no encoder engine (onnxruntime, tensorrt, torch); they read "
    )


def test_one_engines_settings_pass_for_its_sibling_variants(tmp_path: Path) -> None:
    """minilm's pattern: ONNX Runtime's `providers` beside a torch variant's `torch`, and a
    TensorRT variant's build settings."""
    text = (
        "kind: batch\nbackend: onnxruntime\nparameters: {providers: [CPUExecutionProvider]}\n"
        "variants: {default: {}, t: {backend: torch, parameters: {torch: {device: cpu}}}, "
        "trt: {backend: tensorrt, parameters: {precision: fp16, workspace_mib: 512}}}\n"
    )
    assert _load(tmp_path, text).get("m") is not None


def test_the_settings_allowed_are_those_the_encoder_engines_read() -> None:
    read: set[str] = set()
    for backend in ENCODER_BACKENDS:
        spec = importlib.util.find_spec(BACKENDS[backend].partition(":")[0])
        assert spec is not None and spec.origin is not None
        read |= set(READ.findall(Path(spec.origin).read_text()))
    own = set(EncoderParameters.model_fields)
    assert read - own <= ENGINE_SETTINGS
    assert ENGINE_SETTINGS - {"torch"} == read - own  # `torch`: TorchOptions, read at load

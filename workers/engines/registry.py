"""Backend name → engine class, imported lazily so GPU libraries load only where they are used."""

from __future__ import annotations

import importlib
from pathlib import Path

from shared.model_repository import ModelConfig
from workers.engines.base import BatchEngine, GenerateEngine

# The same names as shared.model_repository.BACKEND_NAMES, which model configs are checked
# against (tests/test_model_repository_unit.py keeps the two equal).
BACKENDS: dict[str, str] = {
    "identity": "workers.engines.identity_engine:IdentityEngine",
    "onnxruntime": "workers.engines.onnxruntime_engine:OnnxRuntimeEngine",
    "tensorrt": "workers.engines.tensorrt_engine:TensorRTEngine",
    "torch": "workers.engines.torch_engine:TorchEngine",
    "vllm": "workers.engines.vllm_engine:VllmEngine",
}


class EngineNotFound(ImportError):
    """A backend whose engine cannot be had (its module, its class or its constructor fails):
    the worker cannot serve its model."""


def engine_class(backend: str) -> type[BatchEngine] | type[GenerateEngine]:
    """A known backend name, or `package.module:Class` for a custom engine (like Triton's
    Python backend: the engine's code lives with the deployment, not in Conveyor)."""
    target = BACKENDS.get(backend, backend if ":" in backend else None)
    if target is None:
        raise ValueError(f"unknown backend {backend!r}; known: {sorted(BACKENDS)}")
    module_name, _, class_name = target.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    # A custom engine's typo, its missing package, or its own code failing as it imports (a
    # SyntaxError, a check of its licence or device): the last escaped naming no backend.
    except Exception as exc:
        raise EngineNotFound(f"backend {backend!r}: cannot import {target}: {exc}") from exc
    if not (isinstance(found, type) and issubclass(found, BatchEngine | GenerateEngine)):
        raise EngineNotFound(
            f"backend {backend!r}: {target} is not a BatchEngine or GenerateEngine"
        )
    cls: type[BatchEngine] | type[GenerateEngine] = found
    return cls


def create_engine(
    config: ModelConfig, variant: str, artifact_root: Path
) -> BatchEngine | GenerateEngine:
    """Build (not load) the engine for one partition (a variant may name its own backend); its
    artifacts live in `<root>/<model>/`. What fails is named with the model and variant: the
    worker's log said only the backend, or a custom engine's bare exception."""
    backend = config.backend_of(variant)
    owner = f"model {config.name} variant {variant}"
    try:
        cls = engine_class(backend)
    except EngineNotFound as exc:
        raise EngineNotFound(f"{owner}: {exc}") from exc.__cause__
    serves = "generate" if issubclass(cls, GenerateEngine) else "batch"
    if serves != config.kind:  # the producer serves the kind; the worker's loop the engine's
        raise EngineNotFound(
            f"backend {backend!r}: {cls.__name__} serves kind {serves}; model {config.name} "
            f"has kind {config.kind}"
        )
    try:
        return cls(config, variant, str(artifact_root / config.name))
    except Exception as exc:  # an abstract class, or a custom constructor's own failure
        raise EngineNotFound(
            f"{owner}: backend {backend!r}: {cls.__name__} could not be built: "
            f"{type(exc).__name__}: {exc}"
        ) from exc

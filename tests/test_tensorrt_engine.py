"""The minilm encoder on TensorRT: an FP16 engine built from the exported ONNX serves the same
vectors as the PyTorch weights, padding per call, and its plan is built once and reused.
Runs only where a CUDA GPU with tensorrt and pycuda exists."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from shared.model_repository import ModelConfig
from tests.gpu_requirements import needs_gpu
from tests.minilm_reference import (
    DIMENSION,
    SENTENCES,
    minilm_config,
    prepared_artifacts,
    recording_engine,
    reference_embeddings,
    vectors,
)
from workers.engines.tensorrt_engine import (
    BuildSettings,
    TensorRTEngine,
    build_inputs,
    calibration_cache_path,
    check_precision_supported,
)

on_tensorrt = needs_gpu("tensorrt", "pycuda")

SHORT_TEXTS = ["hi", "a cat", "queues and workers", "one more short sentence here"]


@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The exported artifacts linked into a temporary folder, so built plans land there."""
    source = prepared_artifacts()
    folder = tmp_path_factory.mktemp("minilm-trt")
    for name in ("model.onnx", "tokenizer.json"):
        (folder / name).symlink_to(source / name)
    return folder


def tensorrt_config(**parameters: Any) -> ModelConfig:
    """minilm's config served on TensorRT, with `parameters` over its own."""
    config = minilm_config()
    return config.model_copy(
        update={"backend": "tensorrt", "parameters": {**config.parameters, **parameters}}
    )


def make_engine(artifact_dir: Path, **parameters: Any) -> TensorRTEngine:
    return recording_engine(TensorRTEngine, tensorrt_config(**parameters), artifact_dir)


@pytest.fixture(scope="module")
def engine(artifact_dir: Path) -> Iterator[TensorRTEngine]:
    engine = make_engine(artifact_dir, precision="fp16", max_batch=16, opt_batch=8)
    engine.warmup()
    yield engine
    engine.close()


@pytest.mark.gpu
@on_tensorrt
def test_fp16_embeddings_equal_the_pytorch_reference(engine):
    engine.call_shapes.clear()
    got = vectors(engine.infer([{"texts": SENTENCES[:5]}, {"texts": SENTENCES[5:]}]))
    assert got.shape == (len(SENTENCES), DIMENSION)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    cosines = (got * reference_embeddings(SENTENCES)).sum(axis=1)
    assert cosines.min() >= 0.999, dict(zip(SENTENCES, cosines.round(6), strict=True))
    assert engine.call_shapes == [(len(SENTENCES), 256)]


@pytest.mark.gpu
@on_tensorrt
def test_padding_is_per_call_and_does_not_change_vectors(engine):
    engine.call_shapes.clear()
    together = vectors(engine.infer([{"texts": SHORT_TEXTS}]))
    rows, width = engine.call_shapes[0]
    assert rows == len(SHORT_TEXTS) and width < 16
    alone = vectors([out for t in SHORT_TEXTS for out in engine.infer([{"texts": [t]}])])
    assert (together * alone).sum(axis=1).min() >= 0.9999


@pytest.mark.gpu
@on_tensorrt
def test_more_texts_than_the_profile_allows_run_as_several_calls(engine):
    engine.call_shapes.clear()
    texts = [f"sentence number {i}" for i in range(40)]
    outputs = engine.infer([{"texts": texts[:25]}, {"texts": texts[25:]}])
    assert [rows for rows, _ in engine.call_shapes] == [16, 16, 8]
    assert [len(out["embeddings"]) for out in outputs] == [25, 15]
    assert (vectors(outputs) * reference_embeddings(texts)).sum(axis=1).min() >= 0.999


@pytest.mark.gpu
@on_tensorrt
def test_the_plan_is_built_once_and_reused(engine, artifact_dir):
    plans = sorted((artifact_dir / "tensorrt").glob("model.fp16.*.plan"))
    assert len(plans) == 1
    built_at = plans[0].stat().st_mtime_ns
    again = make_engine(artifact_dir, precision="fp16", max_batch=16, opt_batch=8)
    try:
        got = vectors(again.infer([{"texts": SHORT_TEXTS}]))
    finally:
        again.close()
    assert plans[0].stat().st_mtime_ns == built_at
    assert (got * reference_embeddings(SHORT_TEXTS)).sum(axis=1).min() >= 0.999


class StandInCudaError(Exception):
    """pycuda.driver.Error's stand-in: the base of every CUDA error pycuda raises."""


class StandInContext:
    """The engine's primary context and pycuda's `Context` statics that `dead` touches;
    `fault` stands for a CUDA error that poisoned the context."""

    def __init__(self, fault: bool) -> None:
        self.fault = fault
        self.pushed = 0
        self.synchronized = 0

    def push(self) -> None:
        self.pushed += 1

    def pop(self) -> None:
        self.pushed -= 1

    def synchronize(self) -> None:
        assert self.pushed == 1, "synchronized off the engine's device"
        self.synchronized += 1
        if self.fault:
            raise StandInCudaError("cuCtxSynchronize failed: an illegal memory access")


@pytest.mark.parametrize("fault", [True, False])
def test_an_engine_whose_context_faulted_is_dead(fault: bool) -> None:
    """Without `dead`, every queued job was bisected and failed after a CUDA fault; the
    engine now asks its own context, made current on the asking thread (no GPU needed)."""
    engine = unloaded_engine()
    context = StandInContext(fault)
    engine._cuda = SimpleNamespace(Error=StandInCudaError, Context=context)
    engine._device_context = context
    assert engine.dead() is fault
    assert (context.synchronized, context.pushed) == (1, 0)


def test_settings_refuse_what_tensorrt_cannot_build():
    """Plain configuration checks: they run on any machine, before a GPU is touched."""
    with pytest.raises(ValueError, match="precision"):
        BuildSettings.from_parameters({"precision": "fp8"}, 32, 128)
    with pytest.raises(ValueError, match="calibration_file"):
        BuildSettings.from_parameters({"precision": "int8"}, 32, 128)
    with pytest.raises(ValueError, match="opt <= max"):
        BuildSettings.from_parameters({"opt_batch": 64}, 32, 128)
    with pytest.raises(ValueError, match="opt <= max"):  # the variant's max_seq_length is max
        BuildSettings.from_parameters({"opt_seq": 64}, 32, 16)
    assert BuildSettings.from_parameters({}, 32, 16).opt_seq == 16


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_batch", "many"),  # refused by int() naming no setting
        ("opt_seq", 2.5),  # read as 2
        ("opt_batch", True),  # read as 1
        ("workspace_mib", 0),  # failed the build on the GPU
        ("calibration_batch", 0),  # failed calibration on the GPU
    ],
)
def test_settings_that_are_no_positive_whole_number_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=rf"parameters.{name} must be a whole number of 1 or more"):
        BuildSettings.from_parameters({name: value}, 32, 128)
    with pytest.raises(ValueError, match="calibration_file must be a path"):
        BuildSettings.from_parameters({"precision": "int8", "calibration_file": 7}, 32, 128)


def unloaded_engine(**parameters: Any) -> TensorRTEngine:
    """One with no artifacts: its load's checks of settings and packages come first."""
    return TensorRTEngine(tensorrt_config(**parameters), "default", "unused")


@pytest.mark.parametrize("device_id", ["gpu0", -1, 1.5, True])
def test_a_device_id_that_is_no_gpu_index_is_refused_by_name(device_id: Any) -> None:
    """`int()` read 1.5 as GPU 1 and `true` as 1, and "gpu0" failed naming no setting; it is
    checked before the GPU packages are imported, so on any machine."""
    engine = unloaded_engine(device_id=device_id)
    with pytest.raises(ValueError, match=r"^parameters.device_id must be a whole number of 0 or"):
        engine.load()


@pytest.mark.skipif(
    find_spec("tensorrt") is not None and find_spec("pycuda") is not None,
    reason="tensorrt and pycuda are installed",
)
def test_a_machine_without_the_gpu_packages_is_told_what_to_install() -> None:
    """It failed with only "No module named 'pycuda'": not which backend, nor how to have it."""
    with pytest.raises(ImportError) as refused:
        unloaded_engine().load()
    message = str(refused.value)
    assert message.startswith("backend tensorrt needs the packages tensorrt and pycuda, and ")
    assert "install the project's `gpu` extra (`pip install '.[gpu]'`" in message
    missing = [name for name in ("tensorrt", "pycuda") if find_spec(name) is None]
    assert f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not" in message


def test_weak_typing_and_implicit_int8_are_refused_on_tensorrt_11():
    """TensorRT 11 removed BuilderFlag.FP16/INT8 and the calibrators; 10.x still has them."""
    for precision in ("fp16", "int8"):
        check_precision_supported("10.13.0", precision)
        with pytest.raises(RuntimeError, match="removed in TensorRT 11"):
            check_precision_supported("11.1.0", precision)
    check_precision_supported("11.1.0", "fp32")


def test_int8_caches_are_keyed_by_what_they_are_built_from(tmp_path: Path) -> None:
    """The INT8 calibration cache was named by the calibration file's stem and opt_seq alone,
    and the plan by its path: edited calibration texts, another calibration_batch or a new
    model.onnx reused stale scales. Both keys now change with each (no GPU needed)."""
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"the first exported graph")
    texts = tmp_path / "calibration.txt"
    texts.write_text("a first text\na second text\n")
    parameters = {"precision": "int8", "calibration_file": str(texts)}
    settings = BuildSettings.from_parameters(parameters, 32, 128)

    def keys(settings: BuildSettings = settings) -> tuple[Path, dict[str, Any]]:
        return calibration_cache_path(onnx, settings), build_inputs(onnx, settings)

    seen = [keys()]
    assert keys() == seen[0]  # nothing changed: both caches are found again
    assert seen[0][0].parent == tmp_path and seen[0][0].suffix == ".calibration"
    seen.append(keys(replace(settings, calibration_batch=8)))
    texts.write_text("a first text\nanother second text\n")  # the same file, other texts
    seen.append(keys())
    onnx.write_bytes(b"a graph exported again, of another size")  # model.onnx replaced
    seen.append(keys())
    assert len({path for path, _ in seen}) == len(seen)
    plans = [inputs for _, inputs in seen]
    assert all(a != b for i, a in enumerate(plans) for b in plans[i + 1 :])

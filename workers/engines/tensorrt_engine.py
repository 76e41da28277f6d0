"""Sentence-encoder engine on TensorRT 10 for GPU workers: builds (once per GPU, TensorRT version
and settings) a serialized engine from the ONNX artifact with a dynamic-shape optimization
profile in FP32, FP16 or INT8, then runs each micro-batch through preallocated pycuda buffers.

Tokenisation and pooling are those of the ONNX Runtime engine (`text_encoding`), so both serve
the same vectors. tensorrt and pycuda are imported inside methods: this module imports on any
machine, and a load where they are missing says so (`require_gpu_packages`).

Precision, reviewed against the TensorRT 10 and 11 Python API docs: FP16 here is "weak typing"
(BuilderFlag.FP16 plus per-layer precision constraints, deprecated in 10.12) and INT8 is implicit
quantization (IInt8EntropyCalibrator2, `int8_calibrator`, `set_calibration_profile`, deprecated
in 10.1). Both still work on every TensorRT 10.x and both are removed in 11, whose replacements
(strongly typed FP16 graphs from ModelOpt AutoCast, explicit Q/DQ quantization) need a graph
rewritten by NVIDIA's ModelOpt toolchain that this project cannot install or test. So they stay,
for TensorRT 10 only (the `gpu` extra pins it): on 11, `fp32` builds and the other precisions
fail with an error that says so, instead of an AttributeError deep in the build."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from shared.model_repository import DEFAULT_MAX_SEQ_LENGTH
from workers.engines.base import BatchEngine
from workers.engines.text_encoding import (
    TOKENIZER_FILE,
    TextEncoder,
    TokenBatch,
    embed_jobs,
)

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8")
# The first TensorRT release without weak typing and implicit INT8 calibration.
STRONG_TYPING_ONLY = 11


def check_precision_supported(tensorrt_version: str, precision: str) -> None:
    """Refuse fp16/int8 builds on a TensorRT that removed the APIs they use (see above)."""
    if int(tensorrt_version.split(".")[0]) >= STRONG_TYPING_ONLY and precision != "fp32":
        raise RuntimeError(
            f"precision {precision} uses weak typing / implicit INT8 calibration, removed in "
            f"TensorRT {STRONG_TYPING_ONLY} (this is {tensorrt_version}); use TensorRT 10, or "
            "precision fp32, or an ONNX graph already cast/quantized with NVIDIA ModelOpt"
        )


# What this engine imports besides the CPU install's packages: the project's `gpu` extra.
GPU_PACKAGES = ("tensorrt", "pycuda")


def missing_gpu_packages() -> list[str]:
    return [name for name in GPU_PACKAGES if find_spec(name) is None]


def require_gpu_packages() -> None:
    """A worker without them failed the load with only "No module named 'pycuda'", which named
    neither the backend that needs it nor how to have it."""
    missing = missing_gpu_packages()
    if missing:
        raise ImportError(
            f"backend tensorrt needs the packages {' and '.join(GPU_PACKAGES)}, and "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
            "install the project's `gpu` extra (`pip install '.[gpu]'`: TensorRT 10 and pycuda) "
            "on a machine with an NVIDIA GPU and CUDA, or serve this variant on another backend"
        )


@dataclass(frozen=True, slots=True)
class BuildSettings:
    """Everything an engine plan depends on besides the ONNX file, the GPU and TensorRT itself.

    The optimization profile spans (1, 1) to (max_batch, max_seq) token matrices; kernels are
    tuned for (opt_batch, opt_seq). INT8 calibrates on `calibration_file` (one text a line) at
    the fixed shape (calibration_batch, opt_seq) and keeps FP16 for layers without INT8 kernels.
    """

    precision: str = "fp16"
    max_batch: int = 32
    opt_batch: int = 32
    max_seq: int = DEFAULT_MAX_SEQ_LENGTH
    opt_seq: int = 64
    workspace_mib: int = 2048
    calibration_file: str | None = None
    calibration_batch: int = 16

    @classmethod
    def from_parameters(
        cls, parameters: dict[str, Any], max_batch_size: int, max_seq: int
    ) -> BuildSettings:
        """`max_seq`: the variant's checked `max_seq_length` (ModelConfig.encoder_parameters)."""
        max_batch = _whole(parameters, "max_batch", max_batch_size)
        settings = cls(
            precision=str(parameters.get("precision", "fp16")),
            max_batch=max_batch,
            opt_batch=_whole(parameters, "opt_batch", max_batch),
            max_seq=max_seq,
            opt_seq=_whole(parameters, "opt_seq", min(64, max_seq)),
            workspace_mib=_whole(parameters, "workspace_mib", 2048),
            calibration_file=_path(parameters, "calibration_file"),
            calibration_batch=_whole(parameters, "calibration_batch", 16),
        )
        settings.check()
        return settings

    def check(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is not one of {PRECISIONS}")
        if not (1 <= self.opt_batch <= self.max_batch and 1 <= self.opt_seq <= self.max_seq):
            raise ValueError(f"profile needs 1 <= opt <= max: {self}")
        if self.precision == "int8" and not self.calibration_file:
            raise ValueError("precision int8 needs `calibration_file` (one text per line)")

    def shapes(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """(min, opt, max) of every (batch, sequence) input."""
        return (1, 1), (self.opt_batch, self.opt_seq), (self.max_batch, self.max_seq)


def _whole(parameters: dict[str, Any], name: str, default: int, least: int = 1) -> int:
    """A whole number of `least` or more, else an error naming the setting: `int()` read "many"
    as an error that named none, 2.5 as 2 and `true` as 1, and a 0 failed the build on the GPU."""
    value = parameters.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(
            f"parameters.{name} must be a whole number of {least} or more, not {value!r}"
        )
    return value


def _path(parameters: dict[str, Any], name: str) -> str | None:
    """A path setting, None where unset, else an error naming the setting: `Path()` of a number
    or a list failed with a TypeError that named none."""
    value = parameters.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"parameters.{name} must be a path, not {value!r}")
    return value


def build_inputs(onnx_path: Path, settings: BuildSettings) -> dict[str, Any]:
    """What a plan is built from besides the GPU and TensorRT, by identity rather than by name:
    the settings, the calibration file's path replaced by a hash of its texts (INT8 only, the
    one precision that reads them), and the ONNX file's name, size and modification time. So
    edited calibration texts or a replaced model.onnx never reuse a stale plan or INT8 scales."""
    stat = onnx_path.stat()
    calibration = None
    if settings.precision == "int8" and settings.calibration_file:
        calibration = hashlib.sha256(Path(settings.calibration_file).read_bytes()).hexdigest()
    return {
        **asdict(settings),
        "calibration_file": calibration,
        "onnx": [onnx_path.name, stat.st_size, stat.st_mtime_ns],
    }


def _digest(key: Any) -> str:
    return hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:16]


def calibration_cache_path(onnx_path: Path, settings: BuildSettings) -> Path:
    """Beside the ONNX file, named by what its INT8 scales come from: the ONNX file, the
    calibration texts and the (calibration_batch, opt_seq) shape they are fed at."""
    inputs = build_inputs(onnx_path, settings)
    key = [inputs[name] for name in ("onnx", "calibration_file", "calibration_batch", "opt_seq")]
    return onnx_path.with_suffix(f".int8-{_digest(key)}.calibration")


def plan_path(cache_dir: Path, onnx_path: Path, settings: BuildSettings) -> Path:
    """A plan runs only on the GPU model and TensorRT version that built it, from the inputs
    it was built from (`build_inputs`); all of them go into the file name, so a stale plan is
    never loaded."""
    import pycuda.driver as cuda
    import tensorrt as trt

    device = cuda.Context.get_device()
    key = [
        build_inputs(onnx_path, settings),
        trt.__version__,
        device.name(),
        device.compute_capability(),
    ]
    return cache_dir / f"{onnx_path.stem}.{settings.precision}.{_digest(key)}.plan"


def build_plan(onnx_path: Path, settings: BuildSettings, encoder: TextEncoder) -> bytes:
    """Parse the ONNX graph and build a serialized engine (takes a minute or more on a GPU)."""
    import tensorrt as trt

    check_precision_supported(trt.__version__, settings.precision)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10 networks are always explicit-batch
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_mib << 20)
    profile = builder.create_optimization_profile()
    input_names = [network.get_input(i).name for i in range(network.num_inputs)]
    for name in input_names:
        profile.set_shape(name, *settings.shapes())
    config.add_optimization_profile(profile)
    if settings.precision in ("fp16", "int8"):
        _allow_fp16(trt, network, config)
    calibrator = None
    if settings.precision == "int8":
        dtypes = {
            network.get_input(i).name: np.dtype(trt.nptype(network.get_input(i).dtype))
            for i in range(network.num_inputs)
        }
        calibrator = _calibrator(trt, onnx_path, settings, encoder, dtypes)
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = calibrator
        calibration_profile = builder.create_optimization_profile()
        fixed = (settings.calibration_batch, settings.opt_seq)
        for name in input_names:
            calibration_profile.set_shape(name, fixed, fixed, fixed)
        config.set_calibration_profile(calibration_profile)
    serialized = builder.build_serialized_network(network, config)
    if calibrator is not None:
        calibrator.free()
    if serialized is None:
        raise RuntimeError(f"TensorRT could not build {onnx_path} ({settings.precision})")
    return bytes(serialized)


def _allow_fp16(trt: Any, network: Any, config: Any) -> None:
    """FP16 everywhere except the LayerNorms: their variance overflows in half precision
    (TensorRT's own advice for opset-17 LayerNormalization)."""
    config.set_flag(trt.BuilderFlag.FP16)
    config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if layer.type == trt.LayerType.NORMALIZATION:
            layer.precision = trt.float32
            layer.set_output_type(0, trt.float32)


def _calibrator(
    trt: Any,
    onnx_path: Path,
    settings: BuildSettings,
    encoder: TextEncoder,
    dtypes: dict[str, np.dtype],
) -> Any:
    """An entropy calibrator over the texts of `calibration_file` (inputs in the network's own
    dtypes), caching its scales beside the ONNX file so a rebuild skips calibration."""
    import pycuda.driver as cuda

    assert settings.calibration_file is not None
    texts = [
        line.strip()
        for line in Path(settings.calibration_file).read_text().splitlines()
        if line.strip()
    ]
    if len(texts) < settings.calibration_batch:
        raise ValueError(f"{settings.calibration_file} holds fewer texts than one batch")
    cache_path = calibration_cache_path(onnx_path, settings)
    shape = (settings.calibration_batch, settings.opt_seq)

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.batches = iter(
                encoder.tokenize(texts[i : i + shape[0]], pad_to=shape[1])
                for i in range(0, len(texts) - shape[0] + 1, shape[0])
            )
            self.device = {
                name: cuda.mem_alloc(shape[0] * shape[1] * dtype.itemsize)
                for name, dtype in dtypes.items()
            }

        def get_batch_size(self) -> int:
            return shape[0]

        def get_batch(self, names: list[str]) -> list[int] | None:
            batch = next(self.batches, None)
            if batch is None:
                return None
            feeds = batch.feeds()
            for name in names:
                cuda.memcpy_htod(self.device[name], feeds[name].astype(dtypes[name], order="C"))
            return [int(self.device[name]) for name in names]

        def read_calibration_cache(self) -> bytes | None:
            return cache_path.read_bytes() if cache_path.is_file() else None

        def write_calibration_cache(self, cache: Any) -> None:
            _write_atomically(cache_path, bytes(cache))

        def free(self) -> None:
            for allocation in self.device.values():
                allocation.free()

    return EntropyCalibrator()


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


class TensorRTEngine(BatchEngine):
    """One execution context on one GPU (`device_id`), with input and output buffers sized for
    the profile's largest shape so a micro-batch never allocates; micro-batches larger than
    `max_batch` texts run as several calls."""

    def load(self) -> None:
        """The settings are checked before the GPU packages are imported, so a bad one is named
        on any machine; the packages before the artifacts, which no machine without them needs."""
        own = self.config.encoder_parameters(self.variant)
        self.settings = BuildSettings.from_parameters(
            self.parameters, self.config.max_batch_size_of(self.variant), own.max_seq_length
        )
        device_id = _whole(self.parameters, "device_id", 0, least=0)
        self.engine_cache_dir = _path(self.parameters, "engine_cache_dir")
        require_gpu_packages()
        import pycuda.driver as cuda
        import tensorrt as trt

        self._cuda = cuda
        artifact_dir = self.artifacts(TOKENIZER_FILE, self.config.artifact or "model.onnx")
        self.encoder = TextEncoder.from_artifacts(artifact_dir, self.settings.max_seq)
        self.max_texts_per_call = min(
            own.max_texts_per_call or self.settings.max_batch, self.settings.max_batch
        )
        cuda.init()
        device = cuda.Device(device_id)
        self._device_context = device.retain_primary_context()
        with self._on_device():
            plan = self._load_or_build_plan(artifact_dir)
            self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
            self._engine = self._runtime.deserialize_cuda_engine(plan)
            if self._engine is None:
                raise RuntimeError("TensorRT could not deserialize the engine plan")
            self._context = self._engine.create_execution_context()
            self._stream = cuda.Stream()
            self._context.set_optimization_profile_async(0, self._stream.handle)
            self._allocate_buffers(trt)

    def _load_or_build_plan(self, artifact_dir: Path) -> bytes:
        onnx_path = artifact_dir / (self.config.artifact or "model.onnx")
        cache_dir = Path(self.engine_cache_dir or artifact_dir / "tensorrt")
        path = plan_path(cache_dir, onnx_path, self.settings)
        if path.is_file():
            log.info("loading TensorRT plan %s", path)
            return path.read_bytes()
        log.info("building TensorRT %s plan from %s", self.settings.precision, onnx_path)
        plan = build_plan(onnx_path, self.settings, self.encoder)
        cache_dir.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, plan)
        return plan

    def _allocate_buffers(self, trt: Any) -> None:
        """Page-locked host and device buffers per I/O tensor at the profile's largest shape,
        bound to the context once (their addresses never change)."""
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        self._inputs = [
            n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT
        ]
        outputs = [n for n in names if n not in self._inputs]
        if len(outputs) != 1:
            raise RuntimeError(f"expected one output (last_hidden_state), engine has {outputs}")
        self._output = outputs[0]
        for name in self._inputs:
            self._context.set_input_shape(name, self._engine.get_tensor_profile_shape(name, 0)[2])
        self._host: dict[str, np.ndarray] = {}
        self._device: dict[str, Any] = {}
        for name in names:
            shape = self._context.get_tensor_shape(name)
            dtype = np.dtype(trt.nptype(self._engine.get_tensor_dtype(name)))
            self._host[name] = self._cuda.pagelocked_empty(int(trt.volume(shape)), dtype)
            self._device[name] = self._cuda.mem_alloc(self._host[name].nbytes)
            self._context.set_tensor_address(name, int(self._device[name]))

    @contextmanager
    def _on_device(self) -> Iterator[None]:
        """Make the GPU's primary context current on this thread: the batching loop calls the
        engine from a thread pool, and CUDA contexts are per thread."""
        self._device_context.push()
        try:
            yield
        finally:
            self._cuda.Context.pop()

    def warmup(self) -> None:
        self.infer([{"texts": ["warm up the engine", "and its kernels for a batch"]}])

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        with self._on_device():
            return embed_jobs(inputs, self.encoder, self.run_batch, self.max_texts_per_call)

    def run_batch(self, batch: TokenBatch) -> np.ndarray:
        """Copy in, execute, copy out on one stream; the host buffers are reused, so the result
        is copied before the next call can overwrite it."""
        feeds = batch.feeds()
        for name in self._inputs:
            values = feeds[name]
            if not self._context.set_input_shape(name, values.shape):
                raise ValueError(f"shape {values.shape} of {name} is outside the engine profile")
            staged = self._host[name][: values.size]
            staged[:] = values.ravel()
            self._cuda.memcpy_htod_async(self._device[name], staged, self._stream)
        if not self._context.execute_async_v3(stream_handle=self._stream.handle):
            raise RuntimeError("TensorRT execution failed")
        shape = tuple(self._context.get_tensor_shape(self._output))
        result = self._host[self._output][: int(np.prod(shape))]
        self._cuda.memcpy_dtoh_async(result, self._device[self._output], self._stream)
        self._stream.synchronize()
        return result.reshape(shape).astype(np.float32, copy=True)

    def dead(self) -> bool:
        """A CUDA error that poisoned the context (an illegal address, a GPU fallen off the bus)
        fails every call after it: once a call failed, the context is synchronized on this
        thread, and pycuda raises its error there if it can run nothing more."""
        try:
            with self._on_device():
                self._cuda.Context.synchronize()
        except self._cuda.Error:
            return True
        return False

    def close(self) -> None:
        """Free GPU memory and TensorRT objects while the context is current, then release it."""
        if not hasattr(self, "_context"):
            return
        with self._on_device():
            for allocation in self._device.values():
                allocation.free()
            del self._context, self._engine, self._runtime, self._stream
        self._device_context.detach()

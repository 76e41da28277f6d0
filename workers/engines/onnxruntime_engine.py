"""Sentence-encoder engine on ONNX Runtime: the CPU backend of the example models, and on a GPU
the CUDA or TensorRT execution providers, chosen by the model config's `providers`."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnxruntime as ort

from workers.engines.base import StagedBatchEngine
from workers.engines.cpu_budget import CPU_SHARES, check_threads
from workers.engines.text_encoding import (
    DEFAULT_MAX_TEXTS_PER_CALL,
    TOKENIZER_FILE,
    PooledCalls,
    TextCalls,
    TextEncoder,
    TokenBatch,
    pool_calls,
    tokenize_jobs,
)

log = logging.getLogger(__name__)

ProviderSpec = str | tuple[str, dict[str, Any]]
# Providers that run on a GPU, where a CUDA fault poisons the session for every later call.
GPU_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})
# Warm-up's texts, which `dead` probes with too: a shape the session has run (the TensorRT
# provider builds an engine for each new one).
WARMUP_TEXTS = ["warm up the session", "and its kernels for a batch"]


def provider_specs(configured: Any) -> list[ProviderSpec]:
    """Config entries are a provider name or `{name: {option: value}}` (like
    `{CUDAExecutionProvider: {device_id: 0}}`); ONNX Runtime takes names or (name, options).
    One name alone is a list of it (`providers: CUDAExecutionProvider` was read a character at
    a time, and the worker failed on provider `C`); a mapping is a list of its items."""
    specs = [_spec(entry) for entry in _entries(configured)]
    available = set(ort.get_available_providers())
    missing = [_name(s) for s in specs if _name(s) not in available]
    if missing:
        # ONNX Runtime would silently fall back to the CPU; a GPU pool must not.
        raise RuntimeError(f"providers {missing} are not available here; have {sorted(available)}")
    return specs


def _entries(configured: Any) -> list[Any]:
    """The setting as a list of entries: a mapping was iterated as its names alone, dropping
    every provider's options."""
    if isinstance(configured, str):
        return [configured]
    if isinstance(configured, dict):
        return [{name: options} for name, options in configured.items()]
    if isinstance(configured, list):
        return configured
    raise ValueError(
        f"providers must be a provider name, a list of them or {{name: options}}, "
        f"not {configured!r}"
    )


def _spec(entry: Any) -> ProviderSpec:
    """Options that are no mapping (`{CUDAExecutionProvider: 0}`) are refused by name: `dict()`
    of them failed the load with a TypeError that named no setting."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and len(entry) == 1:
        [(name, options)] = entry.items()
        if options is None or isinstance(options, dict):
            return (str(name), dict(options or {}))
    raise ValueError(f"providers entry {entry!r} is neither a name nor {{name: {{options}}}}")


def _check_session_providers(specs: list[ProviderSpec], got: list[str]) -> None:
    """ONNX Runtime only logs a provider it could not create (the GPU wheel lists CUDA as
    available without cuDNN or a visible GPU) and runs the session on the rest, the CPU: a GPU
    pool must not serve from there."""
    missing = [_name(s) for s in specs if _name(s) not in got]
    if missing:
        raise RuntimeError(
            f"the onnxruntime session got providers {got}, not the requested {missing}: "
            "ONNX Runtime could not create them (its log says why: no visible GPU, cuDNN or "
            "TensorRT missing)"
        )


def _name(spec: ProviderSpec) -> str:
    return spec if isinstance(spec, str) else spec[0]


class OnnxRuntimeEngine(StagedBatchEngine):
    """Runs each micro-batch as one session call over all its texts, padded to the longest.
    Staged, so the batching loop tokenises the next micro-batch and writes back the last one
    while the session runs: the session waited for that host work 17 % of the time
    (benchmark part B, 2 cores)."""

    def load(self) -> None:
        model_file = self.config.artifact or "model.onnx"
        artifact_dir = self.artifacts(TOKENIZER_FILE, model_file)
        own = self.config.encoder_parameters(self.variant)
        check_threads(own.intra_op_threads, f"model {self.config.name} variant {self.variant}")
        self.encoder = TextEncoder.from_artifacts(artifact_dir, own.max_seq_length)
        self.max_texts_per_call = own.max_texts_per_call or DEFAULT_MAX_TEXTS_PER_CALL
        model_path = artifact_dir / model_file
        specs = provider_specs(self.parameters.get("providers") or ["CPUExecutionProvider"])
        session = ort.InferenceSession(
            str(model_path),
            sess_options=self._session_options(own.intra_op_threads),
            providers=specs,
        )
        _check_session_providers(specs, session.get_providers())
        self.session = session
        self.input_names = {i.name for i in self.session.get_inputs()}
        log.info("onnxruntime session for %s uses %s", model_path, self.session.get_providers())

    def _session_options(self, intra_op_threads: int) -> ort.SessionOptions:
        """0 threads is this engine's share of the process's CPUs: ONNX Runtime's own 0 is
        every host core for each session, blind to a container's CPU limit and to the other
        sessions of the worker."""
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = CPU_SHARES.threads(intra_op_threads)
        options.inter_op_num_threads = 1
        return options

    def warmup(self) -> None:
        self.infer([{"texts": WARMUP_TEXTS}])

    def prepare(self, inputs: list[dict[str, Any]]) -> TextCalls:
        return tokenize_jobs(inputs, self.encoder, self.max_texts_per_call)

    def run(self, prepared: TextCalls) -> PooledCalls:
        return pool_calls(prepared, self.run_batch)

    def finish(self, running: PooledCalls) -> list[dict[str, Any]]:
        return running.per_job()

    def run_batch(self, batch: TokenBatch) -> np.ndarray:
        """One session call: token batch → last hidden states (batch, sequence, 384)."""
        feeds = {name: value for name, value in batch.feeds().items() if name in self.input_names}
        hidden: np.ndarray = self.session.run(None, feeds)[0]
        return hidden

    def dead(self) -> bool:
        """On a GPU provider, whether warm-up's call still runs once a call failed: after a CUDA
        fault (an illegal address, a GPU fallen off the bus) every call fails, and bisecting
        would fail every queued job. On the CPU a call fails only on its input."""
        if GPU_PROVIDERS.isdisjoint(self.session.get_providers()):
            return False
        try:
            self.run_batch(self.encoder.tokenize(WARMUP_TEXTS))
        except Exception:  # ONNX Runtime's Fail, RuntimeException, EPFail derive from it only
            return True
        return False

    def close(self) -> None:
        self.__dict__.pop("session", None)

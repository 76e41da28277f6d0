"""A worker's CPU threads: its engines share the CPUs it may use (shared/cpu_count.py), its
affinity mask capped by its cgroup's CPU quota. ONNX Runtime and PyTorch size their thread pools
to the host's cores and ignore the quota (microsoft/onnxruntime#29510), so a pod limited to 2
CPUs on a 16-core node ran 16 threads, throttled for most of every CFS period. (The tokenizers
library's Rayon pool already honours the quota: Rust's `available_parallelism` reads it.)"""

from __future__ import annotations

import os
from collections.abc import Iterable

from shared.cpu_count import usable_cpus

# The named backends whose engines build a CPU thread pool (an ONNX Runtime session's intra-op
# pool, PyTorch's); the others run in the worker's own threads (identity, custom engines) or on
# the GPU with vLLM's and TensorRT's own.
CPU_POOL_BACKENDS = frozenset({"onnxruntime", "torch"})


# A set intra_op_threads past this many times the machine's CPUs is refused when a worker loads
# the engine: a config shared with larger nodes may oversubscribe a smaller one a little, but
# 1000 threads on 16 CPUs is a typo (100, or 10) that only contends for them.
MOST_THREADS_PER_CPU = 4


def check_threads(configured: int, owner: str) -> None:
    """Refuse a set thread count far past this machine's CPUs, naming `owner` (its model and
    variant) and the setting: the repository's bound (MAX_INTRA_OP_THREADS) knows no machine."""
    cpus = os.cpu_count() or 1
    if configured > MOST_THREADS_PER_CPU * cpus:
        raise ValueError(
            f"{owner}: parameters.intra_op_threads {configured} is more than "
            f"{MOST_THREADS_PER_CPU} threads per CPU of this machine's {cpus}: a typo? "
            "0 shares the worker's CPUs out automatically"
        )


class CpuShares:
    """How many engines share this process's CPUs, as Triton's model instances share the
    machine's cores: a worker serving N partitions ran N pools, each of all its CPUs, N times
    its CPUs in threads once every partition was busy. The worker says how many before it
    loads them (`share_among`), since a pool is sized once, when its session is built."""

    def __init__(self) -> None:
        self._engines = 1

    def share_among(self, engines: int) -> None:
        self._engines = max(1, engines)

    def share_among_backends(self, backends: Iterable[str]) -> None:
        """Share among the engines of `backends` (one per partition) that build a CPU pool."""
        self.share_among(sum(backend in CPU_POOL_BACKENDS for backend in backends))

    def threads(self, configured: int) -> int:
        """A thread count from a model's config, any but 0 as set. 0 (automatic) is this
        engine's share of `usable_cpus` (1 at least) where several engines share them or a
        quota or an affinity mask narrows the machine, else 0 still: the runtime's own choice
        (ONNX Runtime's is the physical cores, fewer than the logical ones it may run on)."""
        if configured:
            return configured
        usable = usable_cpus()
        if self._engines == 1 and usable >= (os.cpu_count() or usable):
            return 0
        return max(1, usable // self._engines)


# This process's: PyTorch's count is one per process, whatever each engine asks.
CPU_SHARES = CpuShares()

"""A worker's CPU budget: its affinity mask capped by its cgroup's CPU quota, read from a cgroup
folder written here (v2's `cpu.max`, v1's `cpu/cpu.cfs_*_us`), so the CPU engines' automatic
thread counts (`intra_op_threads: 0`) fit a container's CPU limit, not the node's cores."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from shared.cpu_count import cgroup_cpu_limit, usable_cpus
from shared.settings import Settings
from tests.minilm_reference import minilm_config, prepared_artifacts
from tests.test_torch_engine import torch_engine
from workers.engines.cpu_budget import CPU_SHARES, MOST_THREADS_PER_CPU
from workers.engines.onnxruntime_engine import OnnxRuntimeEngine
from workers.runtime.consumer_runtime import ConsumerRuntime

AFFINITY = len(os.sched_getaffinity(0))


def cgroup_v2(root: Path, cpu_max: str) -> Path:
    (root / "cpu.max").write_text(cpu_max + "\n")
    return root


def cgroup_v1(root: Path, quota_us: int, period_us: int = 100_000) -> Path:
    (root / "cpu").mkdir()
    (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text(f"{period_us}\n")
    return root


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("200000 100000", min(2, AFFINITY)),
        ("max 100000", AFFINITY),
        ("50000 100000", 1),  # half a CPU still runs one thread
        ("150000 100000", min(2, AFFINITY)),  # rounded up
    ],
)
def test_a_v2_quota_caps_the_cpus(tmp_path: Path, cpu_max: str, expected: int) -> None:
    assert usable_cpus(cgroup_v2(tmp_path, cpu_max)) == expected


@pytest.mark.parametrize(
    ("quota_us", "expected"), [(200_000, min(2, AFFINITY)), (-1, AFFINITY), (50_000, 1)]
)
def test_a_v1_quota_caps_the_cpus(tmp_path: Path, quota_us: int, expected: int) -> None:
    assert usable_cpus(cgroup_v1(tmp_path, quota_us)) == expected


def test_no_cgroup_files_leave_the_affinity_mask(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None
    assert usable_cpus(tmp_path) == AFFINITY


def test_the_torch_engine_on_the_cpu_threads_to_the_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`intra_op_threads: 0` under a 1-CPU quota: one PyTorch thread, not one per core."""
    monkeypatch.setattr("shared.cpu_count.CGROUP_ROOT", cgroup_v2(tmp_path, "100000 100000"))
    before = torch.get_num_threads()
    try:
        torch_engine(prepared_artifacts(), device="cpu", cuda_graphs=None)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def two_partitions() -> Iterator[None]:
    """A worker that serves two partitions (minilm's two variants), as it tells the budget."""
    before = torch.get_num_threads()
    CPU_SHARES.share_among(2)
    try:
        yield
    finally:
        CPU_SHARES.share_among(1)
        torch.set_num_threads(before)


def test_the_engines_of_one_worker_share_its_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_partitions: None
) -> None:
    """Two partitions under a 2-CPU quota, `intra_op_threads: 0`: the ONNX Runtime session and
    PyTorch each took both CPUs, 4 threads on 2 CPUs once both were busy. Each now has one."""
    monkeypatch.setattr("shared.cpu_count.CGROUP_ROOT", cgroup_v2(tmp_path, "200000 100000"))
    share = max(1, min(2, AFFINITY) // 2)
    onnx = OnnxRuntimeEngine(minilm_config(), "default", str(prepared_artifacts()))
    onnx.load()
    assert onnx.session.get_session_options().intra_op_num_threads == share
    torch_engine(prepared_artifacts(), device="cpu", cuda_graphs=None)
    assert torch.get_num_threads() == share


def test_torch_engines_of_one_worker_agree_on_its_one_thread_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch's count is one per process: a second engine setting another silently changed
    the first's. It is refused, naming both; an automatic one (here 1, the quota's) keeps the
    set count; once the first engine closes, another count may be set."""
    monkeypatch.setattr("shared.cpu_count.CGROUP_ROOT", cgroup_v2(tmp_path, "100000 100000"))
    before = torch.get_num_threads()
    artifacts = prepared_artifacts()
    first = torch_engine(artifacts, {"intra_op_threads": 2}, device="cpu", cuda_graphs=None)
    try:
        with pytest.raises(
            ValueError,
            match="variant torch: intra_op_threads 3, but model minilm variant torch in this "
            "worker set 2: PyTorch has one CPU thread count per process",
        ):
            torch_engine(artifacts, {"intra_op_threads": 3}, device="cpu", cuda_graphs=None)
        torch_engine(artifacts, device="cpu", cuda_graphs=None).close()
        assert torch.get_num_threads() == 2
        first.close()
        torch_engine(artifacts, {"intra_op_threads": 3}, device="cpu", cuda_graphs=None).close()
        assert torch.get_num_threads() == 3
    finally:
        first.close()
        torch.set_num_threads(before)


# A set count a worker on this machine refuses, one more than the most it takes (on 256 CPUs or
# more, past the repository's bound of 1024, which refuses it first)
TYPO_THREADS = MOST_THREADS_PER_CPU * (os.cpu_count() or 1) + 1


def onnx_engine(intra_op_threads: int) -> OnnxRuntimeEngine:
    config = minilm_config()
    parameters = {**config.parameters, "intra_op_threads": intra_op_threads}
    config = config.model_copy(update={"parameters": parameters})
    engine = OnnxRuntimeEngine(config, "default", str(prepared_artifacts()))
    engine.load()
    return engine


def test_a_thread_count_far_past_the_machines_cpus_is_refused_by_name() -> None:
    """A typo such as 1000 started 1000 threads per ONNX Runtime session, or for PyTorch, on a
    machine of a few CPUs: refused when a worker loads the engine, naming it and the setting."""
    refused = (
        rf"^model minilm variant {{}}: parameters.intra_op_threads {TYPO_THREADS} is more than "
        rf"{MOST_THREADS_PER_CPU} threads per CPU of this machine's {os.cpu_count()}"
    )
    with pytest.raises(ValueError, match=refused.format("default")):
        onnx_engine(TYPO_THREADS)
    before = torch.get_num_threads()
    try:
        with pytest.raises(ValueError, match=refused.format("torch")):
            torch_engine(prepared_artifacts(), {"intra_op_threads": TYPO_THREADS}, device="cpu")
        assert torch.get_num_threads() == before
        most = TYPO_THREADS - 1
        assert onnx_engine(most).session.get_session_options().intra_op_num_threads == most
    finally:
        torch.set_num_threads(before)


def test_a_worker_shares_its_cpus_among_the_partitions_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """A real worker serving minilm on ONNX Runtime and on PyTorch, under a 2-CPU quota: it
    tells the budget before it loads them, so PyTorch gets one engine's share (each engine had
    the whole worker's CPUs, so two busy partitions ran twice its CPUs in threads)."""
    monkeypatch.setattr("shared.cpu_count.CGROUP_ROOT", cgroup_v2(tmp_path, "200000 100000"))
    share = max(1, min(2, AFFINITY) // 2)
    before = torch.get_num_threads()
    torch.set_num_threads(share + 1)  # what a worker that did not share would leave as it was
    settings = Settings(
        redis_url=redis_url, key_prefix="cpus:", models=["minilm:default", "minilm:torch"]
    )
    runtime = ConsumerRuntime(settings)
    runtime.start()
    try:
        # read on a new thread, as the engine's calls run: PyTorch's count (OpenMP's) is per
        # thread once a thread has used it, and a new one starts from the last one set
        with ThreadPoolExecutor(1) as fresh:
            assert fresh.submit(torch.get_num_threads).result() == share
        assert CPU_SHARES.threads(0) == share
    finally:
        runtime.stop()
        CPU_SHARES.share_among(1)
        torch.set_num_threads(before)

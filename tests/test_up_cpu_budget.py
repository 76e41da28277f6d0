"""`conveyor up`'s default process counts follow the CPUs it may use (its affinity mask, capped
by its cgroup's CPU quota), not the host's cores: in a 2-CPU container on a 64-core host it
started 48 workers per model, 16 producers and a Valkey with 4 I/O threads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conveyor.commands.up import workers_by_model
from conveyor.embedded_valkey import io_threads
from shared.model_repository import ModelRepository
from shared.settings import Settings
from tests.conftest import REPO_ROOT

HOST_CORES = 64
MODELS = ["identity", "minilm:default", "smollm2"]


@pytest.fixture
def big_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A 64-core host whose cgroup (a folder here, no quota yet) sets no CPU limit."""
    monkeypatch.setattr(os, "cpu_count", lambda: HOST_CORES)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(HOST_CORES)))
    monkeypatch.setattr("shared.cpu_count.CGROUP_ROOT", tmp_path)
    return tmp_path


def _defaults() -> tuple[dict[str, int], int, int]:
    """Workers per model, producers and Valkey I/O threads as `conveyor up` sizes them."""
    repository = ModelRepository.load(REPO_ROOT / "model_repository")
    producers = Settings().producer_processes
    return workers_by_model(repository, MODELS, producers, None), producers, io_threads()


def test_a_two_cpu_quota_sizes_the_stack_to_two_cpus(big_host: Path) -> None:
    (big_host / "cpu.max").write_text("200000 100000\n")
    assert _defaults() == (dict.fromkeys(MODELS, 1), 1, 1)


def test_an_affinity_mask_sizes_the_stack_to_its_cpus(
    big_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    assert _defaults() == ({"identity": 6, "minilm:default": 6, "smollm2": 1}, 4, 4)


def test_without_a_limit_the_host_cores_count(big_host: Path) -> None:
    assert _defaults() == ({"identity": 24, "minilm:default": 24, "smollm2": 1}, 16, 4)

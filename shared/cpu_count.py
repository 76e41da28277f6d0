"""How many CPUs this process may keep busy: its affinity mask, capped by its cgroup's CPU quota
(a container's CPU limit). `os.cpu_count()` is the host's cores: sized by it, `conveyor up` in a
2-CPU container on a 64-core host started 48 workers a model, and ONNX Runtime and PyTorch size
their pools so too (workers/engines/cpu_budget.py)."""

from __future__ import annotations

import math
import os
from pathlib import Path

# A container's own cgroup: v2's unified hierarchy (`cpu.max`), or v1's `cpu` controller.
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path) -> float | None:
    """The quota as CPUs (quota / period, possibly fractional), or None where none is set."""
    cpu_max = root / "cpu.max"  # v2: "<quota> <period>", the quota "max" for none
    if cpu_max.is_file():
        quota, period = cpu_max.read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    v1 = root / "cpu"  # v1: the quota -1 for none
    quota_file = v1 / "cpu.cfs_quota_us"
    if quota_file.is_file():
        quota_us = int(quota_file.read_text())
        return None if quota_us < 0 else quota_us / int((v1 / "cpu.cfs_period_us").read_text())
    return None


def usable_cpus(root: Path | None = None) -> int:
    """The CPUs this process may use: those it may run on, at most its quota rounded up (a
    1.5-CPU limit keeps 2 threads busy in turn rather than leave half a CPU unused)."""
    allowed = _allowed_cpus()
    limit = cgroup_cpu_limit(root or CGROUP_ROOT)
    return allowed if limit is None else min(allowed, math.ceil(limit))


def _allowed_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, or the machine's cores where the
    platform has no such mask (macOS), so the settings' defaults still load there."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1

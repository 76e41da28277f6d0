"""How many CPUs this process may keep busy: its affinity mask, capped by its cgroup's CPU quota
(a container's CPU limit). `os.cpu_count()` is the host's cores: sized by it, `conveyor up` in a
2-CPU container on a 64-core host started 48 workers a model, and ONNX Runtime and PyTorch size
their pools so too (workers/engines/cpu_budget.py)."""

from __future__ import annotations

import math
import os
from pathlib import Path, PurePosixPath

# The cgroup hierarchies' mount (v2's unified one, `cpu.max`; v1's `cpu` controller below it),
# and the file naming this process's cgroup in each, relative to that mount.
CGROUP_ROOT = Path("/sys/fs/cgroup")
OWN_CGROUPS = Path("/proc/self/cgroup")


def cgroup_cpu_limit(root: Path) -> float | None:
    """The quota as CPUs (quota / period, possibly fractional), or None where none is set: the
    tightest of this process's cgroup and those above it. A limit set on a parent binds its
    children, whose own `cpu.max` says "max": a service under a systemd slice with CPUQuota=,
    or a container sharing the host's cgroup namespace, read as having no limit at all."""
    v2, v1 = _own_cgroups()
    limits = [_v2_limit(folder) for folder in _this_and_above(root, v2)]
    limits += [_v1_limit(folder) for folder in _this_and_above(root / "cpu", v1)]
    return min((limit for limit in limits if limit is not None), default=None)


def _v2_limit(folder: Path) -> float | None:
    cpu_max = folder / "cpu.max"  # "<quota> <period>", the quota "max" for none
    if not cpu_max.is_file():
        return None
    quota, period = cpu_max.read_text().split()
    return None if quota == "max" else int(quota) / int(period)


def _v1_limit(folder: Path) -> float | None:
    quota_file = folder / "cpu.cfs_quota_us"  # -1 for none
    if not quota_file.is_file():
        return None
    quota_us = int(quota_file.read_text())
    return None if quota_us < 0 else quota_us / int((folder / "cpu.cfs_period_us").read_text())


def _own_cgroups() -> tuple[str, str]:
    """This process's cgroup paths, v2's and v1's `cpu` controller's: "/" (the mount's own,
    a container's in a cgroup namespace of its own) where the platform has none (macOS)."""
    v2 = v1 = "/"
    lines = OWN_CGROUPS.read_text().splitlines() if OWN_CGROUPS.is_file() else []
    for line in lines:  # "<id>:<controllers>:<path>", the controllers empty for v2
        _, controllers, path = line.split(":", 2)
        if not controllers:
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _this_and_above(mount: Path, path: str) -> list[Path]:
    """`path`'s folder under `mount` and every one above it up to `mount`; only `mount` for a
    path outside this namespace's view ("/../.."). A container shown its own cgroup at the
    mount yet named by its host path has no such folders: its limit is the mount's."""
    parts = PurePosixPath(path).parts[1:]
    if ".." in parts:
        parts = ()
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


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

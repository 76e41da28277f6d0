"""A CPU quota set above this process's own cgroup (a systemd slice's CPUQuota=, a pod's cgroup
seen from a container sharing the host's cgroup namespace) binds it all the same: read from the
cgroup folders written here, named by a `/proc/self/cgroup` written here too."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.cpu_count import cgroup_cpu_limit


def _own_cgroups(monkeypatch: pytest.MonkeyPatch, folder: Path, text: str) -> None:
    (folder / "self-cgroup").write_text(text)
    monkeypatch.setattr("shared.cpu_count.OWN_CGROUPS", folder / "self-cgroup", raising=False)


def test_a_v2_quota_on_a_parent_cgroup_binds_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service's own cpu.max says "max"; its slice's 1.5 CPUs are the limit."""
    service = tmp_path / "conveyor.slice" / "up.service"
    service.mkdir(parents=True)
    (service.parent / "cpu.max").write_text("150000 100000\n")
    (service / "cpu.max").write_text("max 100000\n")
    _own_cgroups(monkeypatch, tmp_path, "0::/conveyor.slice/up.service\n")
    assert cgroup_cpu_limit(tmp_path) == pytest.approx(1.5)


def test_a_v1_quota_tighter_above_the_own_cgroup_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's 2 CPUs above its container's 4: the pod's 2."""
    container = tmp_path / "cpu" / "kubepods" / "pod1" / "c1"
    container.mkdir(parents=True)
    for folder, quota_us in ((container.parent, 200_000), (container, 400_000)):
        (folder / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
        (folder / "cpu.cfs_period_us").write_text("100000\n")
    _own_cgroups(monkeypatch, tmp_path, "4:cpu,cpuacct:/kubepods/pod1/c1\n0::/\n")
    assert cgroup_cpu_limit(tmp_path) == pytest.approx(2.0)

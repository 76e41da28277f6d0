"""The CPU count on a platform without affinity masks (macOS has no `os.sched_getaffinity`):
the settings' defaults read it at import, so every command failed there before any ran."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.cpu_count import usable_cpus


def test_no_affinity_call_counts_the_machine_within_its_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "sched_getaffinity")
    assert usable_cpus(tmp_path) == os.cpu_count()
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert usable_cpus(tmp_path) == 1

"""A canary's gauges taken out of the scrape under several producer processes, where
prometheus_client cannot remove a series: a leader that stepped down showed its last weight."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from producer_api.metrics.api_router import _registry
from shared.metrics import MULTIPROC_DIR

REPO_ROOT = Path(__file__).resolve().parent.parent
# A leader that showed a canary at 20 % running, then hid it (warnings are errors here: a
# removal prometheus_client cannot make only warned).
LEADER = """
from shared.metrics import CANARY_STATE, CANARY_WEIGHT, hide
CANARY_WEIGHT.labels("m", "canary").set(20)
CANARY_STATE.labels("m", "canary", "running").set(1)
hide(CANARY_WEIGHT, "m", "canary")
hide(CANARY_STATE, "m", "canary", "running")
"""


def test_a_hidden_canary_reads_zero_in_a_shared_scrape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, MULTIPROC_DIR: str(tmp_path)}
    command = [sys.executable, "-W", "error::UserWarning", "-c", LEADER]
    subprocess.run(command, env=env, cwd=REPO_ROOT, check=True, timeout=30)
    monkeypatch.setenv(MULTIPROC_DIR, str(tmp_path))
    shown = {
        sample.name: sample.value
        for family in text_string_to_metric_families(generate_latest(_registry()).decode())
        for sample in family.samples
        if sample.labels.get("model") == "m"
    }
    assert shown == {"conveyor_canary_weight": 0.0, "conveyor_canary_state": 0.0}

"""Producer processes sharing a metrics directory (`conveyor up --producers N`): one that exited
keeps its counts in the sums, and takes the gauges it read from Redis with it. They stayed in
every scrape at their last values: a model taken out of config.yaml before the process came
back showed its queue as it was, for as long as the stack ran."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest, multiprocess
from prometheus_client.parser import text_string_to_metric_families

from producer_api.metrics.api_router import _registry
from shared.metrics import MULTIPROC_DIR

REPO_ROOT = Path(__file__).resolve().parent.parent
# What a producer process serving model `gone` leaves in the directory: a submit counted, and
# its partition's gauges as read from Redis.
PRODUCER = """
import os
from shared.metrics import DLQ_DEPTH, JOBS_SUBMITTED, PARTITION_LAG
JOBS_SUBMITTED.labels("gone", "default", "online").inc()
PARTITION_LAG.labels("gone", "default", "online").set(7)
DLQ_DEPTH.labels("gone", "default").set(2)
print(os.getpid())
"""


def test_a_dead_producers_redis_gauges_leave_and_its_counts_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, MULTIPROC_DIR: str(tmp_path)}
    ran = subprocess.run(
        [sys.executable, "-c", PRODUCER],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    multiprocess.mark_process_dead(int(ran.stdout), str(tmp_path))  # as `conveyor up` does
    monkeypatch.setenv(MULTIPROC_DIR, str(tmp_path))

    text = generate_latest(_registry()).decode()
    gone = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("model") == "gone"
    }
    assert gone == {"conveyor_jobs_submitted_total": 1.0}

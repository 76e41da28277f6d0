"""Stack-free: what a worker measures its jobs cost from its own counters, beat by beat, for
backlog seconds (shared/backlog.py)."""

from __future__ import annotations

import pytest

from shared.metrics import GENERATE_BUSY, JOBS_FINISHED, TOKENS
from shared.model_repository import ModelConfig
from workers.runtime.cost_meter import CostMeter


def test_a_generation_over_several_beats_counts_all_its_tokens_per_job() -> None:
    """Beats that finish no job still carry tokens of the job that finishes later: per job
    they count from when jobs last finished (the last beat's 40 alone was a fifth too few)."""
    config = ModelConfig(name="meter-gen", kind="generate", backend="vllm")
    meter = CostMeter([(config, "default")])
    labels = ("meter-gen", "default")
    for beat in range(5):
        TOKENS.labels(*labels).inc(40)
        GENERATE_BUSY.labels(*labels).inc(2.0)
        if beat == 4:
            JOBS_FINISHED.labels(*labels, "succeeded").inc()
        cost = meter.measure()[labels]
    assert cost.units_per_job == pytest.approx(200)
    assert cost.seconds_per_unit == pytest.approx(0.05)

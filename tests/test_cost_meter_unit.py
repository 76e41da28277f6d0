"""Stack-free: what a worker measures its jobs cost from its own counters, beat by beat, for
backlog seconds (shared/backlog.py)."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from shared.metrics import BATCH_SIZE, ENGINE_TIME, GENERATE_BUSY, JOBS_FINISHED, TOKENS, TTFT
from shared.model_repository import ModelConfig
from workers.batching.busy_time import BusyTime
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
            TTFT.labels(*labels).observe(0.5)
        cost = meter.measure()[labels]
    assert cost.units_per_job == pytest.approx(200)
    assert cost.seconds_per_unit == pytest.approx(0.05)


def test_a_generate_models_tokens_per_job_count_every_run_that_generated() -> None:
    """Tokens of failed and cancelled runs were divided by succeeded jobs alone (200 tokens of
    a succeeded and a cancelled run read as 200 per job); a job ended before it ran (cancelled
    while queued, expired, dead-lettered elsewhere) generated none and counts for none."""
    config = ModelConfig(name="meter-runs", kind="generate", backend="vllm")
    meter = CostMeter([(config, "default")])
    labels = ("meter-runs", "default")
    TOKENS.labels(*labels).inc(200)
    GENERATE_BUSY.labels(*labels).inc(4.0)
    for state in ("succeeded", "cancelled", "cancelled", "expired", "failed"):
        JOBS_FINISHED.labels(*labels, state).inc()
    for _ in range(2):  # the succeeded and the first cancelled run streamed tokens
        TTFT.labels(*labels).observe(0.1)
    assert meter.measure()[labels].units_per_job == pytest.approx(100)


def _busy(model: str) -> float | None:
    labels = {"model": model, "variant": "default"}
    return REGISTRY.get_sample_value("conveyor_batch_busy_seconds_total", labels)


def test_overlapping_micro_batches_count_their_time_in_hand_once() -> None:
    """A staged engine reads micro-batch n+1 while n runs: their spans overlap, and the union
    is the time the replica was busy."""
    busy = BusyTime("meter-busy", "default")
    busy.held(100.0, 110.0)
    busy.held(105.0, 112.0)  # read while the first ran
    busy.held(120.0, 125.0)  # after an idle gap, which is not counted
    assert _busy("meter-busy") == pytest.approx(17.0)


def test_a_batch_models_cost_is_its_time_in_hand_per_job_not_its_engine_time() -> None:
    """Engine time left out the host work (tokenising, round trips), most of a job's cost
    beside a GPU: 10 jobs in 0.3 s in hand cost 30 ms each, whatever the engine's 1 ms."""
    config = ModelConfig(name="meter-batch", kind="batch", backend="identity")
    meter = CostMeter([(config, "default")])
    labels = ("meter-batch", "default")
    BATCH_SIZE.labels(*labels).observe(10)
    ENGINE_TIME.labels(*labels).observe(0.001)
    BusyTime(*labels).held(0.0, 0.3)
    assert meter.measure()[labels].seconds_per_unit == pytest.approx(0.03)

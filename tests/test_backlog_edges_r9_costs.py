"""A partition's measured cost hash holding what is no finite number (`nan`, `inf`, text: an
operator's slip, a bug's write) reads as not measured: `nan` passed through the formula (`min`
keeps a NaN), and `conveyor autoscale`, the backlog gauge and KEDA's metrics-api route got NaN
seconds of backlog; text failed the read."""

from __future__ import annotations

import math

import pytest

from shared.backlog import backlog_of
from shared.model_repository import ModelConfig

CONFIG = ModelConfig(name="m", kind="batch", backend="identity")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "not a number"])
def test_a_cost_that_is_no_finite_number_reads_as_not_measured(value: str) -> None:
    cost = {b"seconds_per_unit": value.encode(), b"units_per_job": value.encode()}
    backlog = backlog_of(CONFIG, "default", 3, cost)
    assert not backlog.measured
    assert backlog.seconds_per_unit == CONFIG.autoscaling.backlog.cost_estimate_s
    assert backlog.units_per_job == 1.0
    assert math.isfinite(backlog.scaling_seconds) and backlog.scaling_seconds > 0

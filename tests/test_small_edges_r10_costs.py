"""Stack-free: busy time a worker measured in a beat that counted no unit of work yet (a long
prompt's prefill) belongs to the units of the beats after it, not to nobody."""

from __future__ import annotations

import pytest

from shared.metrics import GENERATE_BUSY, TOKENS, TTFT
from shared.model_repository import ModelConfig
from workers.runtime.cost_meter import CostMeter


def test_busy_seconds_before_the_first_token_count_in_the_cost_per_token() -> None:
    """A 3 s prefill over one beat, then 100 tokens in 1 s: 0.04 s a token, not the 0.01 s of
    the second beat alone (the first beat's busy time was dropped with no token to divide)."""
    config = ModelConfig(name="r10-prefill", kind="generate", backend="vllm")
    meter = CostMeter([(config, "default")])
    labels = ("r10-prefill", "default")
    GENERATE_BUSY.labels(*labels).inc(3.0)
    assert meter.measure() == {}
    GENERATE_BUSY.labels(*labels).inc(1.0)
    TOKENS.labels(*labels).inc(100)
    TTFT.labels(*labels).observe(3.0)
    cost = meter.measure()[labels]
    assert cost.seconds_per_unit == pytest.approx(0.04)
    assert cost.units_per_job == pytest.approx(100)

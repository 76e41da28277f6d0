"""Autoscaling numbers that loaded and then misled the cluster: a `lag_per_replica` whose
thousandths overflow the HPA's int64 (the target wrapped, silently), and an `activation_lag`
that, at zero replicas, leaves a lane's few jobs waiting for company however long, loaded
without a word."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from autoscaling.keda import pool_triggers
from shared.keys import Keys
from shared.model_repository import ModelConfigError
from tests.test_config_yaml_types import load_one

INT64_MAX = 2**63 - 1
HPA_LARGEST = INT64_MAX // 1000  # 9223372036854775: its thousandths still fit an int64


def test_a_lag_per_replica_whose_thousandths_overflow_int64_is_refused(tmp_path: Path) -> None:
    """KEDA hands `streamLength` to the HPA, which reads it as MilliValue(), an int64 that wraps:
    9223372036854776 became -9223372036854775616, and the pool never scaled past its minimum."""
    with pytest.raises(ModelConfigError) as refused:
        load_one(tmp_path, f"autoscaling: {{lag_per_replica: {HPA_LARGEST + 1}}}\n")
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'm' / 'config.yaml'}: autoscaling.lag_per_replica: ")
    assert f"above {HPA_LARGEST}" in message
    (tmp_path / "ok").mkdir()
    largest = f"autoscaling: {{lag_per_replica: {HPA_LARGEST}}}\n"
    config = load_one(tmp_path / "ok", largest).get("m")
    assert config is not None
    targets = {int(t["metadata"]["streamLength"]) for t in pool_triggers(config, "default", Keys())}
    assert targets == {HPA_LARGEST} and HPA_LARGEST * 1000 <= INT64_MAX


def _warnings(caplog: pytest.LogCaptureFixture, root: Path, autoscaling: str) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shared.model_repository"):
        load_one(root, f"autoscaling: {{{autoscaling}}}\n")
    return [r.getMessage() for r in caplog.records if r.name == "shared.model_repository"]


def test_an_activation_lag_at_zero_replicas_is_said_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Up to `activation_lag` jobs per lane never wake a pool at zero replicas: KEDA's trade-off,
    so it loads, but not silently."""
    (warning,) = _warnings(caplog, tmp_path, "activation_lag: 5, min_replicas: 0")
    assert warning.startswith(f"{tmp_path / 'm' / 'config.yaml'}: model m: ")
    assert "autoscaling.activation_lag is 5 with min_replicas 0" in warning


@pytest.mark.parametrize(
    "autoscaling",
    [
        "activation_lag: 5, min_replicas: 1",  # a replica stays up: every job is read
        "activation_lag: 0, min_replicas: 0",  # one job wakes the pool
        "activation_lag: 5, metric: backlog_seconds",  # its trigger activates above 0 s
    ],
)
def test_a_pool_that_wakes_for_one_job_loads_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autoscaling: str
) -> None:
    assert _warnings(caplog, tmp_path, autoscaling) == []

"""KEDA 2.20+ (kedacore/keda#7534) hands the HPA a value or target parsed from `%.3f`: rounded
to the nearest thousandth, where KEDA 2.12-2.19 cut it (`int64(v * 1000)`). The local autoscaler
computes as the current KEDA does, and a `target_s` the two would send far apart is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from autoscaling.local_autoscaler import PoolScaler
from autoscaling.scaling_math import replicas_for_metric
from shared.keys import Keys
from shared.model_repository import ModelConfig, ModelConfigError, ModelRepository

KEYS = Keys("cv:")


@pytest.mark.parametrize(
    ("value", "target", "current", "replicas"),
    [
        (0.0995, 0.001, 1, 100),  # 99.5 thousandths round to 100 (cut: 99)
        (0.0015, 0.001, 5, 2),  # rounds to 2 (cut: 1)
        (0.0005, 0.001, 3, 1),  # rounds to 1 (cut: 0, no replica)
        (0.0025, 0.001, 9, 3),  # the binary 0.0025 lies above the tie: 3 (cut: 2)
        (0.0625, 0.001, 9, 62),  # an exact tie rounds to even, as Go's %.3f does: 62
        (0.2, 0.0995, 1, 2),  # a target of 99.5 thousandths is 100 (cut: 99, 3 replicas)
    ],
)
def test_hpa_math_reads_thousandths_rounded_as_keda_sends_them(
    value: float, target: float, current: int, replicas: int
) -> None:
    assert replicas_for_metric(value, target, current) == replicas


def test_local_autoscaler_scales_on_the_rounded_backlog(redis_client: redis.Redis) -> None:
    """20 queued jobs of 5.026 ms at `target_s: 0.01` are 0.10052 s of backlog: KEDA 2.20+ sends
    101 thousandths, 11 replicas' worth at 10 each; cut to 100, the autoscaler asked for 10."""
    pool = _model({"target_s": 0.01, "cost_estimate_s": 0.005026}, max_replicas=50)
    config = ModelConfig.model_validate({**pool, "name": "r28-rounding"})
    stream = KEYS.queue(config.name, "default")
    redis_client.delete(stream, KEYS.service_cost(config.name, "default"))
    for _ in range(20):
        redis_client.xadd(stream, {"job": "x"})
    scaler = PoolScaler.for_partition(config, "default", KEYS, str, lambda _: None, bool)
    try:
        assert scaler.tick(redis_client) == 11
    finally:
        scaler.release(redis_client)
        redis_client.delete(stream)


@pytest.mark.parametrize("target_s", [0.0015, 0.0095, 0.0011])
def test_a_small_target_between_thousandths_is_refused_by_name(
    tmp_path: Path, target_s: float
) -> None:
    """KEDA before 2.20 sent 0.0015 as 0.001 and 2.20+ as 0.002: a third or half off the
    config, differently by version. It is refused at load, naming the file and the field."""
    root = _write(tmp_path, {"target_s": target_s})
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(root)
    text = str(refused.value)
    assert str(root / "m" / "config.yaml") in text and "autoscaling.backlog.target_s" in text
    assert "not a whole number of thousandths" in text, text


@pytest.mark.parametrize("target_s", [0.001, 0.002, 0.009, 0.0995, 1234.5678])
def test_targets_both_keda_versions_send_close_enough_load(tmp_path: Path, target_s: float) -> None:
    """Whole thousandths under 0.01 s are sent alike; from 0.01 s one thousandth is within the
    HPA's 10 % tolerance, so 0.0995 (99 cut, 100 rounded) still loads."""
    config = ModelRepository.load(_write(tmp_path, {"target_s": target_s})).get("m")
    assert config is not None and config.autoscaling.backlog.target_s == target_s


def _model(backlog: dict[str, float], **autoscaling: int) -> dict[str, Any]:
    """A batch pool scaled on seconds of backlog with these `autoscaling.backlog` settings."""
    scaling = {"metric": "backlog_seconds", "backlog": backlog, **autoscaling}
    return {"name": "m", "kind": "batch", "backend": "identity", "autoscaling": scaling}


def _write(root: Path, backlog: dict[str, float]) -> Path:
    """A model repository holding one such model, `m`."""
    body = {k: v for k, v in _model(backlog).items() if k != "name"}
    (root / "m").mkdir()
    (root / "m" / "config.yaml").write_text(yaml.safe_dump(body))
    return root

"""KEDA names each ScaledObject's HPA `keda-hpa-<name>`, and its admission webhook refuses a
ScaledObject whose HPA name is over 63 characters (`verifyName`, kedacore/keda#7762): a pool
name of 55 to 63 characters (`worker-<model>-<variant>`, from a 40-character model name on)
had `kubectl apply` refused. Such names are shortened with a hash, still distinct."""

from __future__ import annotations

import pytest

from autoscaling.keda import HPA_PREFIX, render, worker_name
from shared.model_repository import ModelConfig
from tests.test_keda import DNS_LABEL, KEYS, crd_errors


def _model(name: str, *variants: str) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": name,
            "kind": "batch",
            "backend": "identity",
            "variants": {v: {} for v in variants},
            "default_variant": variants[0],
        }
    )


@pytest.mark.parametrize("length", [40, 47, 55, 63])
def test_every_pool_gets_an_hpa_name_kubernetes_accepts(length: int) -> None:
    """`worker-<model>-default`: 55 to 77 characters before, each HPA name over 63."""
    config = _model("m" * length, "default", "default2")
    scaled = render([config], KEYS)[1:]
    names = [obj["metadata"]["name"] for obj in scaled]
    assert len(set(names)) == 2
    for obj, name in zip(scaled, names, strict=True):
        assert DNS_LABEL.fullmatch(HPA_PREFIX + name), (HPA_PREFIX + name, len(name))
        assert obj["spec"]["scaleTargetRef"]["name"] == name
        assert crd_errors(obj) == []


def test_a_name_that_fits_is_kept_as_written() -> None:
    """54 characters exactly: `keda-hpa-` makes 63, no hash needed."""
    model = "m" * (54 - len("worker--default"))
    assert worker_name(model, "default") == f"worker-{model}-default"

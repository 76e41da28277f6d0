"""A pool scaled on backlog seconds through KEDA's `prometheus` scaler reads the backlog of its
own namespace: the query had no namespace filter, so with dev and prod scraped by one
Prometheus, `max(…)` took the larger of the two and each scaled on the other's queue."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaling.keda import scaled_object
from shared.keys import Keys
from tests.test_k8s import KUBECTL, NAMESPACES, REPO_ROOT, kustomize
from tests.test_keda import backlog_model, crd_errors

QUERY = "max(conveyor_backlog_scaling_seconds{{{}}})"
POOL = 'model="costly.prometheus",variant="default"'


def _queries(objects: Any) -> list[str]:
    return [
        t["metadata"]["query"]
        for o in objects
        if o["kind"] == "ScaledObject"
        for t in o["spec"]["triggers"]
        if t["type"] == "prometheus"
    ]


@pytest.mark.parametrize(
    ("namespace", "label"), [("conveyor-dev", "conveyor-dev"), (None, "conveyor")]
)
def test_the_query_keeps_to_the_rendered_namespace(namespace: str | None, label: str) -> None:
    """A render without `--namespace` (kustomize's base) reads `conveyor`, as its producer URL
    does."""
    obj = scaled_object(backlog_model("prometheus"), "default", Keys(), namespace)
    assert crd_errors(obj) == []
    assert _queries([obj]) == [QUERY.format(f'namespace="{label}",{POOL}')]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("overlay", sorted(NAMESPACES))
def test_each_overlay_reads_the_backlog_of_its_own_namespace(overlay: str, tmp_path: Path) -> None:
    """Base renders `namespace="conveyor"`; the dev overlay points it at conveyor-dev, as it
    does the metrics-api URLs (kustomize's namespace rewrites neither)."""
    k8s = shutil.copytree(REPO_ROOT / "k8s", tmp_path / "k8s")
    obj = scaled_object(backlog_model("prometheus"), "default", Keys())
    with (k8s / "base" / "keda.yaml").open("a") as keda:
        keda.write(yaml.safe_dump(obj, explicit_start=True))
    expected = QUERY.format(f'namespace="{NAMESPACES[overlay]}",{POOL}')
    assert _queries(kustomize(k8s / "overlays" / overlay)) == [expected]

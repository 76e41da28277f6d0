"""What a Kubernetes operator's review of the manifests asked for: every container bounded by
limits as well as requests, a drain that takes one producer at a time, probes that give a busy
pod the time compose's healthchecks give it, namespaces that refuse an unhardened pod, and the
compose services that run Conveyor's image as locked down as their pods."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_compose import service
from tests.test_k8s import KUBECTL, OVERLAYS, build, of_kind, pod_specs

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
# compose's services that run Conveyor's own image (the rest are upstream images)
CONVEYOR_SERVICES = (
    "producer",
    "producer-cluster",
    "worker-cpu",
    "worker-cpu-cluster",
    "worker-gpu",
)


def seconds(duration: str) -> float:
    """A compose duration of whole seconds (`3s`), as the file writes them."""
    assert duration.endswith("s") and duration[:-1].isdigit(), duration
    return float(duration[:-1])


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_cpu_and_memory_requests_and_limits(overlay: str) -> None:
    """dev set no limit at all (nor base): one leaking worker, or Redis, could take its node's
    memory, and the kubelet evicted its neighbours instead of it."""
    for name, spec in pod_specs(overlay):
        for container in spec["containers"]:
            resources = container.get("resources", {})
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(bound, {})), f"{name}: {bound}"


def disruptions_allowed(pdb: dict[str, Any], replicas: int) -> int:
    spec = pdb["spec"]
    if "maxUnavailable" in spec:
        return int(spec["maxUnavailable"])
    return replicas - int(spec["minAvailable"])


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_drain_evicts_one_producer_at_a_time(overlay: str) -> None:
    """`minAvailable: 1` let a drain evict two of prod's three producers at once: a third of the
    serving capacity took the whole load. Zero would block every drain."""
    producer = of_kind(overlay, "Deployment")["producer"]
    (pdb,) = (
        p
        for p in of_kind(overlay, "PodDisruptionBudget").values()
        if p["spec"]["selector"] == producer["spec"]["selector"]
    )
    assert disruptions_allowed(pdb, producer["spec"]["replicas"]) == 1


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_wait_as_long_as_composes_healthchecks(overlay: str) -> None:
    """No probe set a timeout: kubelet's default 1 s, a third of what compose's healthchecks
    allow the same endpoints, failed a producer or worker that was busy, not dead."""
    allowed = min(seconds(service(s)["healthcheck"]["timeout"]) for s in CONVEYOR_SERVICES)
    for name, spec in pod_specs(overlay):
        for container in spec["containers"]:
            for kind in PROBES:
                if kind in container:
                    assert container[kind].get("timeoutSeconds", 1) >= allowed, f"{name} {kind}"


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_namespaces_refuse_pods_below_the_restricted_standard(overlay: str) -> None:
    """Nothing but these tests kept a pod hardened: one applied without it ran all the same."""
    (namespace,) = (o for o in build(overlay) if o["kind"] == "Namespace")
    labels = namespace["metadata"].get("labels", {})
    assert labels.get("pod-security.kubernetes.io/enforce") == "restricted"


def test_compose_runs_conveyors_image_without_capabilities_or_a_writable_root() -> None:
    """Its pods drop every capability and escalate nothing; its compose services kept Docker's
    default capabilities, and the producer wrote to its root filesystem as it pleased."""
    for name in CONVEYOR_SERVICES:
        spec = service(name)
        assert spec.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in spec.get("security_opt", []), name
    for name in ("producer", "producer-cluster"):
        assert service(name).get("read_only") is True, name
        assert "/tmp" in service(name).get("tmpfs", []), name

"""The shipped cluster deployments give every pod the cluster's nodes as seeds
(`CONVEYOR_REDIS_CLUSTER_NODES`): with only the node its URL names, a producer or worker
(re)started while that node was down could not start, though the cluster served."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autoscaling.keda import SECRET_NAME
from conveyor.stack import free_port
from conveyor.valkey_cluster import LocalCluster
from shared.redis_client import connect
from shared.settings import Settings, get_settings
from tests.test_compose import CLUSTER_TWINS, cluster_nodes, env
from tests.test_k8s import KUBECTL, env_of, of_kind

REPO_ROOT = Path(__file__).resolve().parent.parent
# `--from-literal=addresses=…` of the Secret the overlay and the docs tell an operator to create.
ADDRESSES = re.compile(r"--from-literal=addresses=(\S+)")


def pod_env(container: dict[str, Any], secret: dict[str, str]) -> dict[str, str]:
    """The container's CONVEYOR_ variables as the kubelet sets them, `secret` standing for the
    `conveyor-redis` Secret (the other Secrets' keys play no part in reaching Redis)."""
    resolved = {}
    for name, value in env_of(container).items():
        ref = value.get("secretKeyRef", {}) if isinstance(value, dict) else {}
        if isinstance(value, str):
            resolved[name] = value
        elif ref.get("name") == SECRET_NAME:
            resolved[name] = secret[ref["key"]]
    return {name: value for name, value in resolved.items() if name.startswith("CONVEYOR_")}


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
async def test_prod_cluster_pods_start_from_the_secret_addresses_while_the_url_node_is_down(
    cluster: LocalCluster, settings_env: Callable[..., None]
) -> None:
    secret = {
        "url": f"redis://127.0.0.1:{free_port()}/0",  # the one node it names is down
        "addresses": ",".join(f"127.0.0.1:{node.port}" for node in cluster.masters),
        "password": "",
    }
    deployments = of_kind("prod-cluster", "Deployment")
    assert "producer" in deployments and len(deployments) > 1  # the producer and the workers
    for name, deployment in deployments.items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        settings_env(**pod_env(container, secret))
        settings = get_settings()
        assert settings.redis_cluster and settings.redis_cluster_nodes, name
        client = connect(settings.redis_url, name=name)
        try:
            assert await client.ping(), name
        finally:
            await client.aclose()


def test_compose_cluster_services_start_from_every_node() -> None:
    """valkey-1 alone (the URL's node) was every cluster service's way in."""
    nodes = sorted((name, 6379) for name in cluster_nodes())
    for name in CLUSTER_TWINS:
        service_env = env(name)
        seeds = Settings(
            redis_cluster=service_env["CONVEYOR_REDIS_CLUSTER"],
            redis_cluster_nodes=service_env.get("CONVEYOR_REDIS_CLUSTER_NODES", ""),
        ).redis_cluster_nodes
        assert sorted(seeds) == nodes, name


@pytest.mark.parametrize(
    "document", ["k8s/overlays/prod-cluster/kustomization.yaml", "docs/redis-cluster.md"]
)
def test_the_documented_secret_addresses_are_seeds_the_pods_accept(document: str) -> None:
    """The pods read the Secret's `addresses` as KEDA does: each example list the docs give
    must be one the settings accept, or a pod following them would refuse to start."""
    examples = ADDRESSES.findall((REPO_ROOT / document).read_text())
    assert examples, document
    for addresses in examples:
        nodes = Settings(redis_cluster=True, redis_cluster_nodes=addresses).redis_cluster_nodes
        assert len(nodes) == addresses.count(",") + 1, addresses

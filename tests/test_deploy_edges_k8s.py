"""The producer's manifests against what sits in front of it on Kubernetes."""

from __future__ import annotations

import pytest

from shared.settings import Settings
from tests.test_k8s import KUBECTL, OVERLAYS, env_of, of_kind

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

# The idle timeout of the proxies that keep connections to the producer open for reuse:
# ingress-nginx's upstream-keepalive-timeout, an AWS load balancer's default.
PROXY_IDLE_TIMEOUT_S = 60


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_producer_keeps_idle_connections_open_longer_than_the_proxy(overlay: str) -> None:
    """uvicorn closed an idle connection after 5 s, while the proxy in front kept reusing it for
    60: a request it sent as uvicorn closed got a 502. The producer's CONVEYOR_KEEP_ALIVE_S,
    from the manifest or its default (tests/test_deploy_producer_server.py runs it)."""
    spec = of_kind(overlay, "Deployment")["producer"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    default = Settings.model_fields["keep_alive_s"].default
    keep_alive_s = float(env_of(container).get("CONVEYOR_KEEP_ALIVE_S", default))
    assert keep_alive_s > PROXY_IDLE_TIMEOUT_S

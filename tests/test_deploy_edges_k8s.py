"""The producer's manifests against what sits in front of it on Kubernetes."""

from __future__ import annotations

import pytest

from tests.test_k8s import KUBECTL, OVERLAYS, of_kind

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

# The idle timeout of the proxies that keep connections to the producer open for reuse:
# ingress-nginx's upstream-keepalive-timeout, an AWS load balancer's default.
PROXY_IDLE_TIMEOUT_S = 60


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_producer_keeps_idle_connections_open_longer_than_the_proxy(overlay: str) -> None:
    """uvicorn closed an idle connection after 5 s, while the proxy in front kept reusing it for
    60: a request it sent as uvicorn closed got a 502."""
    spec = of_kind(overlay, "Deployment")["producer"]["spec"]["template"]["spec"]
    (command,) = [c["command"] for c in spec["containers"]]
    assert "--timeout-keep-alive" in command, "uvicorn's default keep-alive is 5 s"
    keep_alive_s = float(command[command.index("--timeout-keep-alive") + 1])
    assert keep_alive_s > PROXY_IDLE_TIMEOUT_S

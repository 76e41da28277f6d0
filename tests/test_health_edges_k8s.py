"""A worker started while Redis is out of reach (restarting, failing over, loading its AOF)
waits for it, its `/healthz` 503 meanwhile, up to its own start deadline (`start_wait_s`), then
exits by itself. The identity pools' startup probes gave up after 60 s and minilm's after 300 s:
the kubelet killed a worker that was only waiting, and one Redis outage of a minute or more put
every worker scaled up meanwhile into CrashLoopBackOff, minutes behind Redis's return."""

from __future__ import annotations

import pytest

from shared.settings import Settings
from tests.test_k8s import KUBECTL, OVERLAYS, env_of, workers
from workers.runtime.consumer_runtime import start_wait_s

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
# The pod's, not this process's environment: the setting's own default where the pod sets none.
DEFAULT_START_TIMEOUT_S = Settings.model_fields["start_timeout_s"].default


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_workers_startup_probe_outlasts_its_own_start_deadline(overlay: str) -> None:
    for name, deployment in workers(overlay).items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        probe = container["startupProbe"]
        budget_s = probe.get("initialDelaySeconds", 0) + (
            probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
        )
        timeout = env_of(container).get("CONVEYOR_START_TIMEOUT_S", DEFAULT_START_TIMEOUT_S)
        assert budget_s >= start_wait_s(Settings(start_timeout_s=float(timeout))), name

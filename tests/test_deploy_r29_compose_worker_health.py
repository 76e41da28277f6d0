"""A compose worker's healthcheck gives it as long as it gives itself to start: it waits for its
engines and for a Redis out of reach (`/healthz` 503 meanwhile) up to its start deadline
(`start_wait_s`), then exits by itself. With a 120 s start period a worker that was only waiting,
or the GPU worker loading vLLM (its image allows 300 s), turned `unhealthy` after ~150 s, and
`docker compose up --wait` failed on it. Kubernetes' startup probes are held to the same
deadline (tests/test_health_edges_k8s.py)."""

from __future__ import annotations

import re

import pytest

from shared.settings import Settings
from tests.test_compose import compose, env, service
from workers.runtime.consumer_runtime import start_wait_s

# The container's, not this process's environment: the setting's default where it sets none.
DEFAULT_START_TIMEOUT_S = Settings.model_fields["start_timeout_s"].default
# Compose's durations: `1m30s`, `90s`, `500ms`.
DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|ns)")
UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# Docker's defaults for what a healthcheck leaves out.
DEFAULT_INTERVAL, DEFAULT_RETRIES = "30s", 3


def seconds(duration: str) -> float:
    parts = DURATION.findall(duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * UNIT_S[u] for n, u in parts)


def celery_workers() -> list[str]:
    return [
        name
        for name, spec in compose()["services"].items()
        if spec.get("command", [])[:1] == ["celery"]
    ]


def test_every_celery_service_is_checked() -> None:
    assert {"worker-cpu", "worker-gpu", "worker-cpu-cluster"} <= set(celery_workers())


@pytest.mark.parametrize("name", celery_workers())
def test_a_workers_healthcheck_outlasts_its_own_start_deadline(name: str) -> None:
    """Docker marks a container unhealthy after `retries` failures past its start period."""
    check = service(name)["healthcheck"]
    budget_s = seconds(check.get("start_period", "0s")) + seconds(
        check.get("interval", DEFAULT_INTERVAL)
    ) * int(check.get("retries", DEFAULT_RETRIES))
    timeout = env(name).get("CONVEYOR_START_TIMEOUT_S", DEFAULT_START_TIMEOUT_S)
    assert budget_s >= start_wait_s(Settings(start_timeout_s=float(timeout))), name

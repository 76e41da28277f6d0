"""Prometheus in the compose stack scrapes every replica of a scaled service: `--scale
worker-cpu=3` (or `--scale producer=N`, as the compose file suggests) made three containers
behind one name, and a fixed `worker-cpu:9100` target reached whichever of them the lookup
answered, so the dashboard counted one replica's jobs of three."""

from __future__ import annotations

from tests.test_compose import compose, env, prometheus_config, scrape_targets, service


def expected_labels(name: str) -> dict[str, str]:
    """The target labels the dashboards and alerts read, from what the service is."""
    spec = service(name)
    labels = {"pipeline": "cluster" if "cluster" in spec.get("profiles", []) else "single"}
    if "CONVEYOR_METRICS_PORT" in env(name):
        gpu = spec["build"]["dockerfile"].endswith(".gpu")
        return labels | {"component": "worker", "accelerator": "gpu" if gpu else "cpu"}
    return labels | {"component": "producer"}


def test_every_replica_of_a_service_is_a_target_of_its_own() -> None:
    static = [
        job["job_name"] for job in prometheus_config()["scrape_configs"] if "static_configs" in job
    ]
    assert static == [], "a fixed host:port scrapes one replica of a scaled service"
    one = scrape_targets(address="10.0.0.2")
    other = scrape_targets(address="10.0.0.3")
    assert one.keys() == other.keys()
    for target, labels in one.items():
        assert labels != other[target], f"{target}: two replicas would share one series"
        name = target.split(":")[0]
        assert name in compose()["services"], target
        kept = {k: v for k, v in labels.items() if k not in {"job", "instance"}}
        assert kept == expected_labels(name), target

"""`conveyor_jobs_rejected_total` counts every submit the producer refused, by reason: an API key
at its `max_in_flight` (429 `too_many_in_flight`) and a Redis that cannot take the job (503
`unavailable`) were answered uncounted, so a dashboard of refusals stayed flat through both
(the metric's own description names "Redis down"). On a real Valkey, through the real app."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from producer_api.app import create_app
from shared.settings import Settings
from tests.conftest import issue_key

PARTITION = {"model": "plain", "variant": "default"}
JOB = {"model": "plain", "inputs": {"n": 1}}


@contextmanager
def _producer(redis_url: str, folder: Path, auth: str) -> Iterator[TestClient]:
    (folder / "plain").mkdir()
    (folder / "plain" / "config.yaml").write_text(
        "kind: batch\nbackend: identity\ninput_schema: {type: object}\n"
    )
    settings = Settings(redis_url=redis_url, auth=auth, model_repository=folder)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        yield client


def _rejected(api: TestClient, reason: str) -> float:
    wanted = {**PARTITION, "reason": reason}
    for family in text_string_to_metric_families(api.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "conveyor_jobs_rejected_total" and sample.labels == wanted:
                return sample.value
    return 0.0


def test_a_key_at_its_max_in_flight_is_counted(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    key = issue_key(redis_url, "acme", "submit", "read", max_in_flight=1)
    headers = {"Authorization": f"Bearer {key}"}
    with _producer(redis_url, tmp_path, "enabled") as api:
        _refused_in_flight(api, headers)


def _refused_in_flight(api: TestClient, headers: dict[str, str]) -> None:
    before = _rejected(api, "too_many_in_flight")
    assert api.post("/v1/jobs", json=JOB, headers=headers).status_code == 202
    refused = api.post("/v1/jobs", json=JOB, headers=headers)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["type"] == "too_many_in_flight"
    assert _rejected(api, "too_many_in_flight") == before + 1


def test_a_redis_that_refuses_the_job_is_counted(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """NOREPLICAS (min-replicas-to-write on a server with none): ENQUEUE is refused, a 503.
    Without keys, as with them the token bucket's own write is refused first."""
    with _producer(redis_url, tmp_path, "disabled") as api:
        before = _rejected(api, "unavailable")
        redis_client.config_set("min-replicas-to-write", 1)
        try:
            refused = api.post("/v1/jobs", json=JOB)
        finally:
            redis_client.config_set("min-replicas-to-write", 0)
        assert refused.status_code == 503, refused.text
        assert _rejected(api, "unavailable") == before + 1

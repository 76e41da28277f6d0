"""A replica's measured cost per job (seconds_per_unit of the backlog-seconds formula), on a real
producer, Valkey and a fresh identity worker: it is the time a micro-batch was in hand per job,
host work included (decoding, the write-back's round trip). It was the engine's time alone: the
identity engine's microseconds per job read as the replica's cost, which cannot keep up with a
thousandth of that, as a GPU encoder's ~10 µs of engine time per job hides ~0.3 ms of host
work, and a pool scaled on backlog seconds asked for a fraction of the replicas it needed."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import httpx
import pytest
import redis

from conveyor.stack import Stack
from shared.keys import Keys
from tests.conftest import running_stack, until

pytestmark = pytest.mark.slow
JOBS = 40


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A worker no other test's jobs have measured before."""
    with running_stack(
        tmp_path_factory.mktemp("cost"), CONVEYOR_AUTH="disabled", workers=("identity:default",)
    ) as stack:
        yield stack


def test_a_replicas_cost_per_job_is_its_time_in_hand_not_its_engine_time(fresh: Stack) -> None:
    engine_s = []
    with httpx.Client(base_url=fresh.base_url, timeout=60) as http:
        for i in range(JOBS):  # one at a time: a micro-batch each
            job = http.post("/v1/jobs?wait=30", json={"model": "identity", "inputs": {"i": i}})
            assert job.status_code == 200 and job.json()["status"] == "succeeded", job.text
            engine_s.append(job.json()["timings"]["engine_ms"] / 1000)
    client = redis.Redis.from_url(fresh.redis_url, decode_responses=True)
    key = Keys(fresh.settings.key_prefix).service_cost("identity", "default")
    until(lambda: client.exists(key), 10)  # the worker's next heartbeat writes it
    cost = float(client.hget(key, "seconds_per_unit") or 0)
    engine = statistics.mean(engine_s)
    print(f"cost per job {cost * 1e6:.0f} µs, engine time per job {engine * 1e6:.1f} µs")
    assert cost > 3 * engine
    client.close()

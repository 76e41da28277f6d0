"""The pipeline on a real Valkey Cluster (#12): a producer and workers with
`CONVEYOR_REDIS_CLUSTER=1`, on two partitions whose slots live on different masters. Submit,
batch, result, long-poll and the SSE stream all work, both partitions progress at once, and the
keys a job's scripts touch sit in its partition's slot."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.crc import key_slot

from conveyor.stack import Stack, free_port
from conveyor.valkey_cluster import LocalCluster, local_cluster
from shared.codec import loads
from shared.keys import Keys, job_tag, partition_tag
from tests.test_llm_pipeline import sse_events

pytestmark = pytest.mark.slow
KEYS = Keys("cv:")
# identity's two variants: their partitions' slots are on different masters of a 3-master
# cluster (asserted, so a change of the tag hash cannot make these tests vacuous).
PARTITIONS = (("identity", "default"), ("identity", "canary"))
JOBS_EACH = 60


@contextmanager
def cluster_stack(
    root: Path, replicas: int = 1, **env: str
) -> Iterator[tuple[LocalCluster, Stack]]:
    """A local cluster of 3 masters with `replicas` each, a producer on it and one identity
    worker per partition."""
    with local_cluster(root / "cluster", node_timeout_ms=1000, replicas=replicas) as cluster:
        url = f"redis://127.0.0.1:{cluster.masters[0].port}/0"
        stack = Stack.create(root / "logs", url, cluster=True)
        stack.env.update({"CONVEYOR_AUTH": "disabled", **env})
        try:
            stack.start_producer(free_port())
            for model, variant in PARTITIONS:
                stack.start_worker(f"{model}:{variant}")
            yield cluster, stack
        finally:
            stack.stop()


@pytest.fixture(scope="module")
def clustered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Stack]]:
    with cluster_stack(tmp_path_factory.mktemp("cluster-pipeline")) as pair:
        yield pair


def submit(base_url: str, variant: str, n: int, wait: float = 0) -> httpx.Response:
    body = {"model": "identity", "variant": variant, "inputs": {"n": n}}
    return httpx.post(f"{base_url}/v1/jobs", params={"wait": wait}, json=body, timeout=wait + 30)


def test_the_partitions_live_on_different_masters(clustered: tuple[LocalCluster, Stack]) -> None:
    cluster, _ = clustered
    owners = {cluster.master_of(KEYS.queue(m, v)).port for m, v in PARTITIONS}
    assert len(owners) == len(PARTITIONS)


def test_submit_wait_poll_and_sse_on_each_partition(clustered: tuple[LocalCluster, Stack]) -> None:
    cluster, stack = clustered
    for model, variant in PARTITIONS:
        waited = submit(stack.base_url, variant, 7, wait=20)
        assert waited.status_code == 200, waited.text
        job = waited.json()
        assert job["status"] == "succeeded" and job["outputs"] == {"n": 7}
        assert job_tag(job["id"]) == partition_tag(model, variant)

        accepted = submit(stack.base_url, variant, 8)
        assert accepted.status_code == 202
        job_id = accepted.json()["id"]
        polled = httpx.get(f"{stack.base_url}/v1/jobs/{job_id}", params={"wait": 20}, timeout=40)
        assert polled.json()["status"] == "succeeded" and polled.json()["outputs"] == {"n": 8}
        with httpx.stream("GET", f"{stack.base_url}/v1/jobs/{job_id}/events", timeout=30) as sse:
            events = list(sse_events(sse.iter_lines()))
        assert events[-1]["event"] == "final", events
        assert loads(events[-1]["data"])["outputs"] == {"n": 8}

        # The job's hash, its entry's stream and the reply channel share one slot.
        slots = {key_slot(k.encode()) for k in (KEYS.job(job_id), KEYS.queue(model, variant))}
        assert len(slots) == 1
        stored = cluster.client().hget(KEYS.job(job_id), "status")
        assert stored == b"succeeded"


def _load(base_url: str, variant: str) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(8) as pool:
        accepted = list(pool.map(lambda n: submit(base_url, variant, n), range(JOBS_EACH)))
        assert all(r.status_code == 202 for r in accepted)
        ids = [r.json()["id"] for r in accepted]
        return list(pool.map(lambda i: _final(base_url, i), ids))


def _final(base_url: str, job_id: str) -> dict[str, Any]:
    job: dict[str, Any] = httpx.get(
        f"{base_url}/v1/jobs/{job_id}", params={"wait": 60}, timeout=90
    ).json()
    return job


def test_both_partitions_progress_at_once(clustered: tuple[LocalCluster, Stack]) -> None:
    """Each master serves its own partition: loaded together, both finish every job, and
    their busy periods overlap (neither waits for the other)."""
    _, stack = clustered
    with ThreadPoolExecutor(len(PARTITIONS)) as pool:
        runs = list(pool.map(lambda p: _load(stack.base_url, p[1]), PARTITIONS))
    spans = []
    for jobs in runs:
        assert [j["status"] for j in jobs] == ["succeeded"] * JOBS_EACH
        finished = sorted(j["timings"]["finished"] for j in jobs)
        spans.append((finished[0], finished[-1]))
    (first_start, first_end), (second_start, second_end) = spans
    overlap = min(first_end, second_end) - max(first_start, second_start)
    print(f"partition busy spans {spans}, overlap {overlap:.2f} s")
    assert overlap > 0


def test_nothing_spans_slots(clustered: tuple[LocalCluster, Stack]) -> None:
    """Every key of the partition's jobs is in the partition's slot: the lane, its counters,
    recent list, job hashes, drained counters (a SCAN of the test cluster, not the product)."""
    cluster, _ = clustered
    for model, variant in PARTITIONS:
        tag = "{" + partition_tag(model, variant) + "}"
        node = cluster.master_of(KEYS.queue(model, variant)).client()
        names = [k.decode() for k in node.scan_iter(match=f"*{tag}*", count=1000)]
        assert any(n.startswith("cv:job:") for n in names)
        assert {key_slot(n.encode()) for n in names} == {key_slot(tag.encode())}


def test_every_key_carries_a_hash_tag(
    clustered: tuple[LocalCluster, Stack],
) -> None:
    """No key was written without a tag into a random slot by a code path that assumes one
    server: every key in the cluster carries a hash tag."""
    cluster, _ = clustered
    names: list[str] = []
    for master in cluster.masters:
        client: redis.Redis = master.client()
        names += [k.decode() for k in client.scan_iter(count=1000)]
    assert names  # the stack has written its keys
    untagged = [
        n
        for n in names
        if not (tag := re.search(r"\{([^{}]+)\}", n))
        or key_slot(n.encode()) != key_slot(tag.group(1).encode())
    ]
    assert untagged == []

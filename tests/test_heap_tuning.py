"""Garbage collection in serving processes (shared/heap_tuning.py): start-up's heap frozen, young
collections rare, so a busy producer never stops its event loop for a full collection."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conveyor.stack import Stack

REQUESTS, CONCURRENCY = 1_500, 32


def _settled(**env: str) -> list[int]:
    """settle_heap in a fresh interpreter with `env` set: [frozen objects, young threshold]."""
    code = (
        "import gc; from shared.settings import Settings; "
        "from shared.heap_tuning import settle_heap; settle_heap(Settings()); "
        "print(gc.get_freeze_count(), gc.get_threshold()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return [int(n) for n in out.stdout.split()]


def test_settle_heap_freezes_start_up_and_sets_the_young_threshold() -> None:
    frozen, young = _settled()
    assert frozen > 1_000, "the imported modules' objects should be frozen"
    assert young == 10_000
    assert _settled(CONVEYOR_GC_FREEZE="0", CONVEYOR_GC_YOUNG_THRESHOLD="2500") == [0, 2_500]


def _collections(metrics_url: str) -> dict[str, float]:
    """`python_gc_collections_total` by generation, from a process's /metrics."""
    text = httpx.get(metrics_url, timeout=10).text
    return {
        sample.labels["generation"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "python_gc_collections"
        for sample in family.samples
        if sample.name == "python_gc_collections_total"
    }


async def _load(base_url: str) -> None:
    requests = iter(range(REQUESTS))

    async def client(http: httpx.AsyncClient) -> None:
        for n in requests:
            reply = await http.post("/v1/models/identity/predict", json={"inputs": {"n": n}})
            assert reply.status_code == 200, reply.text

    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(CONCURRENCY)))


def test_a_busy_producer_and_worker_run_no_garbage_collection(
    stack: Stack, base_url: str, identity_worker: int
) -> None:
    """With CPython's defaults this load runs 7 to 18 young collections in each process (at part
    A's rates, a young one every ~10 requests and a full one, ~0.1 s of a blocked event loop,
    every ~1,200); tuned, none."""
    urls = {
        "producer": f"{base_url}/metrics",
        "worker": f"http://127.0.0.1:{stack.metrics_ports['identity-default']}/metrics",
    }
    before = {name: _collections(url) for name, url in urls.items()}
    asyncio.run(_load(base_url))
    for name, url in urls.items():
        after = _collections(url)
        young = after["0"] - before[name]["0"]
        print(f"{name}: {young:.0f} young collections over {REQUESTS} requests")
        assert young <= 3, f"{name} ran {young:.0f} young collections (defaults: 7 to 18 here)"
        assert after["2"] == before[name]["2"], f"{name} ran a full collection"

"""Online jobs keep their latency while a large batch drains on the bulk lane of the same model:
the worker serves the online stream first and gives the bulk lane only a share (`bulk_share`)
while both have work. Wall-clock figures are printed for the record; the assertion is a
generous bound relative to the same machine idle, and far below what a FIFO queue would give."""

from __future__ import annotations

import json
import statistics
import time

import httpx
import pytest

from tests.conftest import until

pytestmark = pytest.mark.slow
BULK_ITEMS = 5000


def _online_waits(client: httpx.Client, count: int) -> list[float]:
    """Queue wait (ms) of `count` online minilm jobs, one after another."""
    waits = []
    for i in range(count):
        response = client.post(
            "/v1/models/minilm/predict", json={"inputs": {"texts": [f"online question {i}"]}}
        )
        assert response.status_code == 200, response.text
        waits.append(response.json()["timings"]["queue_wait_ms"])
        time.sleep(0.1)
    return waits


def _succeeded_at_least(client: httpx.Client, batch_id: str, wanted: int) -> int | None:
    done = _counts(client, batch_id)["succeeded"]
    return done if done >= wanted else None


def _counts(client: httpx.Client, batch_id: str) -> dict[str, int]:
    counts: dict[str, int] = client.get(f"/v1/batches/{batch_id}").json()["counts"]
    return counts


def test_online_jobs_stay_prompt_while_a_bulk_batch_drains(
    base_url: str, minilm_worker: int
) -> None:
    with httpx.Client(base_url=base_url, timeout=60) as client:
        idle = _online_waits(client, 10)
        lines = "".join(
            json.dumps({"custom_id": f"b{i}", "body": {"inputs": {"texts": [f"bulk text {i}"]}}})
            + "\n"
            for i in range(BULK_ITEMS)
        )
        created = client.post("/v1/batches", params={"model": "minilm"}, content=lines)
        assert created.status_code == 202, created.text
        batch_id = created.json()["id"]
        try:
            # the drain rate over a window that starts after the upload answered: items the
            # worker ran while the upload was still being enqueued would inflate it
            started, before = time.monotonic(), _counts(client, batch_id)["succeeded"]
            wanted = before + 300
            done: int = until(lambda: _succeeded_at_least(client, batch_id, wanted), timeout=300)
            rate = (done - before) / (time.monotonic() - started)
            loaded = _online_waits(client, 10)
            pending = _counts(client, batch_id)["pending"]
        finally:
            client.post(f"/v1/batches/{batch_id}/cancel")
    fifo_ms = pending / rate * 1000  # what an online job would wait behind the backlog in FIFO
    print(
        f"\nonline queue wait, idle: median {statistics.median(idle):.0f} ms, max {max(idle):.0f}"
        f" ms; draining a {BULK_ITEMS}-item batch ({rate:.0f} items/s, {pending} pending):"
        f" median {statistics.median(loaded):.0f} ms, max {max(loaded):.0f} ms;"
        f" FIFO would be ~{fifo_ms:.0f} ms"
    )
    assert pending > 1000, "the batch drained before the online jobs could compete with it"
    assert max(loaded) < 2000 + 10 * statistics.median(idle)
    assert max(loaded) < fifo_ms / 5

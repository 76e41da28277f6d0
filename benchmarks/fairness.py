"""Part F, fair queuing: tenant A floods minilm with `fair_flood` jobs at once, then tenant B sends
a job every QUIET_GAP_S until the flood drained (`fair_quiet` at least). B's queue wait (from each
job's own `queue_wait_ms`) with fair queuing off (arrival order) and on (weighted deficit round
robin), against B alone on the idle pipeline (`fair_unloaded` jobs). Target: the p99 of B's
jobs that met the flood, with fair queuing on, at most 2x B's unloaded p99. One worker serves
every run; each mode has its own producer, since `queue.fair` is read where jobs are enqueued.
Where CUDA is, the worker serves minilm's PyTorch variant on the GPU (fp16, CUDA graphs), whose
micro-batches take about a millisecond: it drains jobs faster than one producer admits them, so
the worker is stopped while a flood is admitted and started again before B's first job, or no
flood would ever queue."""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
import redis.asyncio as aioredis

from benchmarks.pipeline_stack import ARTIFACT_DIR, repository_copy
from benchmarks.report import PartResult, Table, Target, ratio
from benchmarks.scales import Scale
from conveyor.stack import Stack, free_port
from shared.api_keys import ApiKeyStore, KeySpec
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.redis_client import connect
from workers.engines.torch_engine import cuda_missing

TITLE = "Fair queuing: a quiet tenant beside a flood"
MODEL = "minilm"
TEXT = "a short sentence of the kind people send to a model"
QUIET_GAP_S = 0.02
SUBMITTERS = 32  # the flood's concurrent clients
WORKER = "worker"
TARGET_RATIO = 2.0
MOST_QUIET = 5_000  # B's jobs beside one flood, whatever happens to its drain
# How closely B's first job follows the worker's first read: Stack's own wait looks every 0.2 s,
# in which a quiet CPU drained a 100-job flood whole (0.22 s) before B sent anything.
READY_POLL_S = 0.005
NO_LIMITS: dict[str, Any] = {"rate_per_s": 1e6, "burst": 1_000_000, "max_in_flight": 10**7}


def run(scale: Scale, workdir: Path) -> PartResult:
    stack = Stack.create(workdir / "logs")
    stack.env["CONVEYOR_AUTH"] = "enabled"
    try:
        urls = {mode: _producer(stack, workdir, mode) for mode in (False, True)}
        repository = repository_copy(workdir, "repository-worker", {})
        start_worker = functools.partial(
            _start_worker,
            stack,
            CONVEYOR_MODEL_REPOSITORY=str(repository),
            CONVEYOR_ARTIFACT_DIR=str(ARTIFACT_DIR),
        )
        start_worker()
        flooder, quiet = asyncio.run(_keys(stack.redis_url))
        asyncio.run(_quiet(urls[True], quiet, 4))  # warm-up: sessions, caches, the first batch
        runs = [{"run": "B alone (unloaded)", **asyncio.run(_quiet_run(urls[True], quiet, scale))}]
        for fair, label in ((False, "flood, fair queuing off"), (True, "flood, fair queuing on")):
            stack.stop_process(WORKER)  # a warm shutdown: it finishes and acks what it holds
            flood = asyncio.run(_flood(urls[fair], flooder, scale))
            start_worker()
            quiet_ids = asyncio.run(_beside_flood(urls[fair], quiet, scale.fair_quiet, stack))
            quiet_timings = asyncio.run(_timings(urls[fair], quiet, quiet_ids))
            _wait_drained(stack)  # A's timings are read after, so polls never slow the drain
            flood_timings = asyncio.run(_timings(urls[fair], flooder, flood))
            runs.append({"run": label, **_beside(quiet_timings, flood_timings)})
    finally:
        stack.stop()
    return _result(runs, scale)


def _start_worker(stack: Stack, **env: str) -> None:
    """The worker, once it reads: looked for every READY_POLL_S, so that B's first job meets
    the flood it is started into."""
    stack.wait_ready(
        stack.spawn_worker(f"{MODEL}:{_variant()}", WORKER, **env), every_s=READY_POLL_S
    )


def _producer(stack: Stack, workdir: Path, fair: bool) -> str:
    """A producer whose minilm config has `queue.fair` = `fair` (the window: its default)."""
    config = ModelRepository.load(repository_copy(workdir, "probe", {})).models[MODEL]
    queue = {**config.queue.model_dump(exclude_defaults=True), "fair": fair}
    repository = repository_copy(workdir, f"repository-fair-{fair}", {MODEL: {"queue": queue}})
    name = "producer-fair" if fair else "producer-fifo"
    return stack.start_producer(free_port(), name, CONVEYOR_MODEL_REPOSITORY=str(repository))


async def _keys(redis_url: str) -> tuple[str, str]:
    client = connect(redis_url)
    try:
        store = ApiKeyStore(client, Keys())
        keys = []
        for tenant in ("flood", "quiet"):
            spec = KeySpec(tenant=tenant, scopes=frozenset({"submit", "read"}), **NO_LIMITS)
            keys.append((await store.create(spec))[0])
        return keys[0], keys[1]
    finally:
        await client.aclose()


@functools.cache
def _variant() -> str:
    return "default" if cuda_missing() else "torch"


def _body() -> dict[str, Any]:
    return {"model": MODEL, "variant": _variant(), "inputs": {"texts": [TEXT]}}


async def _submit(client: httpx.AsyncClient, key: str) -> str:
    response = await client.post("/v1/jobs", json=_body(), headers={"X-API-Key": key})
    response.raise_for_status()
    return str(response.json()["id"])


async def _quiet(url: str, key: str, count: int) -> list[str]:
    """B: `count` jobs, one every QUIET_GAP_S."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        ids = []
        for _ in range(count):
            ids.append(await _submit(client, key))
            await asyncio.sleep(QUIET_GAP_S)
        return ids


async def _beside_flood(url: str, key: str, least: int, stack: Stack) -> list[str]:
    """B beside the flood: a job every QUIET_GAP_S, at least `least`, until the flood drained
    (at most MOST_QUIET): the p99 of a fixed 50 was one job's wait."""
    client = aioredis.Redis.from_url(stack.redis_url)
    stream = Keys().queue(MODEL, _variant())
    try:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            ids: list[str] = []
            while len(ids) < MOST_QUIET and (len(ids) < least or await _left(client, stream)):
                ids.append(await _submit(http, key))
                await asyncio.sleep(QUIET_GAP_S)
            return ids
    finally:
        await client.aclose()


async def _left(client: aioredis.Redis, stream: str) -> bool:
    """Whether more of the flood is queued or held than B's own job in flight."""
    queued: int = await client.xlen(stream)
    held = int(await client.hget(Keys().fair(stream), "held") or 0)
    return queued + held > 1


async def _timings(url: str, key: str, ids: list[str]) -> list[dict[str, Any]]:
    """Each job's timings once it has ended (a long-poll per job, SUBMITTERS at a time)."""
    gate = asyncio.Semaphore(SUBMITTERS)
    async with httpx.AsyncClient(base_url=url, timeout=180) as client:

        async def one(job_id: str) -> dict[str, Any]:
            async with gate:
                response = await client.get(
                    f"/v1/jobs/{job_id}", params={"wait": 120}, headers={"X-API-Key": key}
                )
                job = response.json()
                assert job["status"] == "succeeded", job
                return dict(job["timings"])

        return list(await asyncio.gather(*(one(i) for i in ids)))


async def _quiet_run(url: str, key: str, scale: Scale) -> dict[str, Any]:
    timings = await _timings(url, key, await _quiet(url, key, scale.fair_unloaded))
    return {
        "quiet_waits_ms": [t["queue_wait_ms"] for t in timings],
        "quiet_e2e_ms": _end_to_end_ms(timings),
    }


def _end_to_end_ms(timings: list[dict[str, Any]]) -> list[float]:
    """Submit to finished: the queue wait, the engine's time and the write-back."""
    return [round((t["finished"] - t["created"]) * 1000, 1) for t in timings]


async def _flood(url: str, flooder: str, scale: Scale) -> list[str]:
    """A's `fair_flood` jobs, SUBMITTERS at a time."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        gate = asyncio.Semaphore(SUBMITTERS)

        async def flood_one() -> str:
            async with gate:
                return await _submit(client, flooder)

        return list(await asyncio.gather(*(flood_one() for _ in range(scale.fair_flood))))


def _beside(quiet: list[dict[str, Any]], flood: list[dict[str, Any]]) -> dict[str, Any]:
    """B's figures beside the flood: which of its jobs met it, and how long the flood took."""
    flood_ended = max(t["finished"] for t in flood)
    met = [t["queue_wait_ms"] for t in quiet if t["created"] < flood_ended]
    return {
        "quiet_waits_ms": [t["queue_wait_ms"] for t in quiet],
        "quiet_e2e_ms": _end_to_end_ms(quiet),
        "quiet_during_flood_waits_ms": met,
        "flood_waits_ms": [t["queue_wait_ms"] for t in flood],
        "flood_drain_s": round(flood_ended - min(t["started"] for t in flood), 3),
        "quiet_during_flood": len(met),
    }


def _wait_drained(stack: Stack, timeout: float = 120.0) -> None:
    """Nothing queued, in flight or held on the lane, so one run never spills into the next."""
    client = redis.Redis.from_url(stack.redis_url)
    stream = Keys().queue(MODEL, _variant())
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not client.xlen(stream) and not int(client.hget(Keys().fair(stream), "held") or 0):
                return
            time.sleep(0.1)
    finally:
        client.close()
    raise TimeoutError(f"{stream} still has entries after {timeout:.0f}s")


def _p(values: list[float], q: float) -> float:
    """The q-quantile, interpolated between samples as the other parts' percentiles are."""
    return float(np.percentile(values, q * 100)) if values else float("nan")


def _result(runs: list[dict[str, Any]], scale: Scale) -> PartResult:
    rows = []
    for r in runs:
        quiet = r.get("quiet_during_flood_waits_ms", r["quiet_waits_ms"])
        flood, e2e = r.get("flood_waits_ms", []), r["quiet_e2e_ms"]
        rows.append(
            [
                r["run"],
                len(r["quiet_waits_ms"]),
                round(statistics.median(quiet), 1) if quiet else "-",
                round(_p(quiet, 0.99), 1),
                round(statistics.median(e2e), 1),
                round(_p(e2e, 0.99), 1),
                r.get("quiet_during_flood", "-"),
                len(flood) or "-",
                round(statistics.median(flood), 1) if flood else "-",
                r.get("flood_drain_s", "-"),
            ]
        )
    unloaded = _p(runs[0]["quiet_waits_ms"], 0.99)
    fifo, fair = (_p(r["quiet_during_flood_waits_ms"], 0.99) for r in runs[1:])
    met = runs[2]["quiet_during_flood"]
    detail = (
        f"B p99 {fair:.1f} ms with fair queuing on, {fifo:.1f} ms off (over the"
        f" {met} and {runs[1]['quiet_during_flood']} of B's jobs"
        f" submitted before the flood's last job ended), {unloaded:.1f} ms unloaded; the flood"
        f" drained in {runs[2]['flood_drain_s']} s"
    )
    if met < scale.fair_met:  # a p99 of too few is one job's wait: no verdict (NaN)
        detail += f"; {met} of B's jobs met the flood, fewer than the {scale.fair_met} needed"
    target = Target(
        f"B's p99 queue wait under a {scale.fair_flood:,}-job flood with fair queuing on,"
        " ÷ its unloaded p99",
        ratio(fair, unloaded) if met >= scale.fair_met else float("nan"),
        TARGET_RATIO,
        higher_is_better=False,
        detail=detail,
    )
    return PartResult(
        part="F",
        title=TITLE,
        tables=[
            Table(
                f"Tenant B's queue wait and end-to-end time (ms): a job every"
                f" {QUIET_GAP_S * 1000:.0f} ms until the flood drained, {scale.fair_quiet} at"
                f" least ({scale.fair_unloaded} alone), beside tenant"
                f" A's {scale.fair_flood:,} jobs"
                f" ({MODEL}:{_variant()}, one worker)",
                [
                    "run",
                    "B jobs",
                    "B p50",
                    "B p99",
                    "B end-to-end p50",
                    "B end-to-end p99",
                    "B during flood",
                    "A jobs",
                    "A p50",
                    "A drain s",
                ],
                rows,
            )
        ],
        targets=[target],
        notes=[
            "A's jobs are all admitted while the worker is stopped, and it starts again before"
            " B's first job, so B finds the whole flood queued however fast the engine drains"
            " it. 'B during flood' counts B's jobs submitted before A's last one finished; a"
            " flood row's B p50 and p99 are over those, and so is the target (no verdict over"
            f" fewer than {scale.fair_met} of them). 'A drain s' runs from the worker's first"
            " start on A's jobs to their last finish.",
            "With fair queuing on a B job waits for the micro-batch in hand and its turn in the"
            " ring, which the next read serves (a fair lane's stream holds no more of the flood"
            " than that read takes); a micro-batch is not preempted, so that floor stays"
            " whatever the flood's size.",
            "minilm's engine is staged: the worker reads micro-batch n+1 while the engine runs n,"
            " so a B job can find one more micro-batch ahead of it than a read alone would give;"
            " its queue wait runs until the engine starts on it, and end to end is submit to"
            " finished.",
        ],
        data={"runs": runs, "quiet_gap_s": QUIET_GAP_S},
    )

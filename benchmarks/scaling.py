"""Part E, scale: P producers, P workers and P load-generator processes (closed loop, one per
producer) at growing P up to the machine's cores, on one Redis. Each step adds producer+worker
pairs to the running stack; throughput, latency and CPU per job by process group show whether
the pipeline scales out and when the single Redis becomes the limit: its main thread, which runs
every command and script (1 ÷ that thread's CPU per job), once I/O threads read, parse and write
for it on a machine with cores to spare."""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from benchmarks.load import MergedRuns, closed_loop_run
from benchmarks.load import Target as LoadTarget
from benchmarks.pipeline_stack import IDENTITY_PAYLOAD as PAYLOAD
from benchmarks.pipeline_stack import running_stack, start_worker
from benchmarks.process_cpu import LOAD_GENERATOR, CpuMeter, ThreadMeter, busy_share
from benchmarks.report import PartResult, Plot, Series, Table, Target, ratio
from benchmarks.scales import Scale
from conveyor.embedded_valkey import io_threads
from conveyor.stack import Stack, free_port

TITLE = "Scale: producers and workers on one Redis"
GROUPS = ("producer", "worker", "redis")
LINEAR_TARGET = 0.8


def pair_counts(max_pairs: int) -> list[int]:
    """1, 2, 4, … below `max_pairs`, then `max_pairs` itself (the machine's cores)."""
    counts, n = [], 1
    while n < max_pairs:
        counts.append(n)
        n *= 2
    return [*counts, max(1, max_pairs)]


def run(scale: Scale, workdir: Path) -> PartResult:
    cores = os.cpu_count() or 1
    counts = pair_counts(scale.scale_max_pairs or cores)
    threads = scale.scale_io_threads or io_threads(cores)
    urls: list[str] = []
    pids: dict[str, int] = {}
    steps = []
    with running_stack(workdir, valkey_config={"io-threads": str(threads)}) as stack:
        with stack.client() as server:
            setting: dict[str, str] = server.config_get("io-threads")
        configured = int(setting["io-threads"])
        urls.append(f"{stack.base_url}/v1/models/identity/predict")
        pids["producer-1"] = stack.processes["producer"].pid
        pids["redis"] = stack.processes["valkey"].pid
        for pairs in counts:
            _grow(stack, workdir, pairs, urls, pids)
            steps.append(measure(pairs, urls, pids, scale))
    return PartResult(
        part="E",
        title=TITLE,
        tables=[_table(steps)],
        targets=targets(steps),
        plots=[_plot(steps)],
        notes=[
            f"Closed loop: {scale.scale_concurrency} clients per load-generator process, one "
            "process per producer (each producer on its own port, so the load splits evenly), "
            f"{scale.seconds:g} s per step after a {scale.warmup_s:g} s warm-up; the identity "
            "model, so the pipeline's own cost is measured. CPU ms per job sums each group's "
            "processes (/proc, over the measured window); Redis utilisation is its CPU seconds "
            f"per wall second. Valkey ran with io-threads {configured} (its main thread "
            "counted): from 8 cores a quarter of them, at most 4, read, parse and write for "
            "the main thread, which runs every command and script. The projected ceiling is 1 "
            "÷ the main thread's CPU per job (its busiest thread's): the jobs/s one Redis "
            "could carry were every other process on cores of its own; none is projected from "
            f"a main thread over {SATURATED:.0%} busy, whose CPU per job then says how busy it "
            "was, not what a job costs it (with I/O threads it polls rather than sleeps, and "
            "reads near 100 % from 2 pairs while jobs/s still grows 4x). The load "
            "generators run on the same cores as the pipeline, and so does anything else on "
            "the machine: on few cores the growth from 1 to 2 pairs is bounded by the cores, "
            "not by the design. `machine CPU busy` is the share of all cores' time not idle "
            "over the step (pipeline, load generators and any neighbours).",
        ],
        data={"payload": PAYLOAD, "io_threads": configured, "steps": steps},
    )


def _grow(stack: Stack, workdir: Path, pairs: int, urls: list[str], pids: dict[str, int]) -> None:
    """Add producer+worker pairs up to `pairs` (the stack came with the first producer); each
    producer on a port of its own, reading the same repository copy."""
    repository = str(workdir / "model_repository")
    workers = sum(name.startswith("worker") for name in pids)
    for number in range(workers + 1, pairs + 1):
        if number > len(urls):
            name = f"producer-{number}"
            url = stack.start_producer(free_port(), name, CONVEYOR_MODEL_REPOSITORY=repository)
            urls.append(f"{url}/v1/models/identity/predict")
            pids[name] = stack.processes[name].pid
        pids[f"worker-{number}"] = start_worker(
            stack, workdir, "identity:default", f"identity-{number}", {}
        )


def _load(url: str, concurrency: int, seconds: float, max_requests: int) -> dict[str, Any]:
    """One load-generator process's closed loop (runs in a pool process)."""
    return closed_loop_run(LoadTarget.post(url, [PAYLOAD]), concurrency, seconds, max_requests)


# A Redis main thread busier than this projects no ceiling: its ceiling would be the jobs/s
# measured (1 ÷ its CPU per job at ~100 % busy), circular.
SATURATED = 0.7


def measure(pairs: int, urls: list[str], pids: dict[str, int], scale: Scale) -> dict[str, Any]:
    """One step: warm every generator up, then all of them at once while CPU is metered."""
    c, n = scale.scale_concurrency, scale.max_requests
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=pairs, mp_context=context) as pool:
        list(pool.map(_load, urls, [c] * pairs, [scale.warmup_s] * pairs, [n] * pairs))
        meter, redis_threads = CpuMeter(pids), ThreadMeter({"redis": pids["redis"]})
        meter.start()
        redis_threads.start()
        machine, began = psutil.cpu_times(), time.monotonic()
        loads = list(pool.map(_load, urls, [c] * pairs, [scale.seconds] * pairs, [n] * pairs))
        cpu_s, seconds = meter.stop(), time.monotonic() - began
        [main, *_] = redis_threads.stop(seconds, top=1)["redis"]["busiest"]
        busy = busy_share(machine, psutil.cpu_times())
    merged = MergedRuns.of(loads)
    jobs = merged.jobs
    by_group = {g: sum(v for k, v in cpu_s.items() if k.startswith(g)) for g in GROUPS}
    by_group[LOAD_GENERATOR] = merged.cpu_s  # theirs, on the same cores
    cpu_ms = {g: round(s * 1000.0 / jobs, 3) if jobs else float("nan") for g, s in by_group.items()}
    main_ms = round(main * seconds * 1000.0 / jobs, 4) if jobs else float("nan")
    return {
        "pairs": pairs,
        "jobs": jobs,
        "errors": merged.errors,
        "jobs_per_s": round(merged.jobs_per_s, 1),
        "p50_ms": round(merged.percentile_ms(50), 2),
        "p99_ms": round(merged.percentile_ms(99), 2),
        "cpu_ms": cpu_ms,
        "redis_utilisation": round(by_group["redis"] / seconds, 3),  # the meter's window
        "redis_main_ms": main_ms,
        "redis_main_utilisation": round(main, 3),
        "redis_ceiling_per_s": round(1000.0 / main_ms)
        if main_ms > 0 and main < SATURATED
        else None,
        "machine_busy": busy,
    }


def targets(steps: list[dict[str, Any]]) -> list[Target]:
    by = {step["pairs"]: step for step in steps}
    if 1 not in by or 2 not in by:
        return []
    one, two = by[1]["jobs_per_s"], by[2]["jobs_per_s"]
    return [
        Target(
            "jobs/s at 2 pairs ÷ twice jobs/s at 1 pair",
            ratio(two, 2 * one),
            LINEAR_TARGET,
            higher_is_better=True,
            detail=f"{two:.0f} vs {one:.0f} jobs/s (producer+worker pairs on one Redis).",
            errors=by[1]["errors"] + by[2]["errors"],
        )
    ]


def _table(steps: list[dict[str, Any]]) -> Table:
    return Table(
        "Closed-loop identity jobs by producer+worker pairs",
        [
            "pairs",
            "jobs/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "producer CPU ms/job",
            "worker CPU ms/job",
            "Redis CPU ms/job",
            "load generator CPU ms/job",
            "Redis CPU utilisation",
            "Redis main thread CPU ms/job",
            "Redis main thread utilisation",
            "projected Redis ceiling jobs/s",
            "machine CPU busy",
        ],
        [
            [
                s["pairs"],
                s["jobs_per_s"],
                s["p50_ms"],
                s["p99_ms"],
                s["errors"],
                *(s["cpu_ms"][g] for g in GROUPS),
                s["cpu_ms"][LOAD_GENERATOR],
                s["redis_utilisation"],
                s["redis_main_ms"],
                s["redis_main_utilisation"],
                s["redis_ceiling_per_s"],
                s["machine_busy"],
            ]
            for s in steps
        ],
    )


def _plot(steps: list[dict[str, Any]]) -> Plot:
    pairs = [s["pairs"] for s in steps]
    first = steps[0]["jobs_per_s"] / steps[0]["pairs"]
    return Plot(
        "E_scale.png",
        "Identity jobs/s by producer+worker pairs",
        "producer+worker pairs",
        "jobs/s",
        [
            Series("measured", pairs, [s["jobs_per_s"] for s in steps]),
            Series("linear from 1 pair", pairs, [first * p for p in pairs]),
        ],
    )

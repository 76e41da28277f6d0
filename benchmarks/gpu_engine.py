"""Part G: the PyTorch engine on a GPU. In-process, one engine call (tokens already prepared,
seq 32) at batch 1/32/64/256 in fp32 eager, fp16 eager and fp16 with CUDA graphs; then the
pipeline serving `minilm:torch` for jobs of 1 and of 32 texts (those of 32 also with their
vectors as base64), with one worker process on the GPU and then several, as a share of the
engine's own limit at the micro-batch those jobs make. With every worker the loads run at a
second, larger count of clients too: a closed loop's rate is its clients over its latency, so
this says whether more jobs in flight find capacity the first count left unused.
Needs CUDA: without it the part is skipped (nothing is written, so an earlier GPU run's results
stay)."""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.batching_efficiency import sentences
from benchmarks.load import MergedRuns, closed_loop, closed_loop_run
from benchmarks.load import Target as LoadTarget
from benchmarks.pipeline_stack import (
    ARTIFACT_DIR,
    MODEL_REPOSITORY,
    running_stack,
    start_worker,
)
from benchmarks.process_cpu import CpuMeter, ThreadMeter, cores_busy
from benchmarks.profiling import profile_during
from benchmarks.report import PartResult, Skipped, Table, Target, ratio
from benchmarks.scales import Scale
from shared.model_repository import ModelRepository
from workers.engines.text_encoding import JobSplit
from workers.engines.torch_engine import PreparedBatch, TorchEngine, cuda_missing

TITLE = "PyTorch engine on a GPU: fp16, CUDA graphs, pipeline ÷ engine"
SEQ = 32
BATCHES = (1, 32, 64, 256)
# (label, dtype, CUDA graphs)
MODES = (
    ("fp32 eager", "fp32", False),
    ("fp16 eager", "fp16", False),
    ("fp16 + graph", "fp16", True),
)
# Texts per job → the engine batch one micro-batch of such jobs runs at (max_batch_size 32
# jobs of 1 text; 32 jobs of 32 texts are split into calls of the largest bucket, 256).
JOB_SIZES = {1: 32, 32: 256}
# The loads: (texts per job, encoding_format); base64 leaves out writing and parsing numbers.
LOADS = ((1, "float"), (32, "float"), (32, "base64"))
# Closed-loop clients, spread over LOAD_PROCESSES generator processes (one process parsing
# 130 KB answers of 32 vectors kept most of a core busy at 64 clients): the first count with
# each number of workers, both with the most.
CONCURRENCIES = (64, 256)
# As `conveyor up` sizes them (CONVEYOR_PRODUCER_PROCESSES' default): one GPU worker needs
# several producers, each costing more CPU per job than the worker does.
PRODUCERS = max(1, (os.cpu_count() or 1) // 4)
# GPU workers sharing the one device: one, then as many as there are producers. A worker's host
# work (tokenising, writing outputs) keeps about one core busy while the GPU runs a micro-batch
# in under a ms, so one worker leaves the device idle most of the time; `conveyor up` starts a
# worker per core its producers leave.
WORKER_COUNTS = (1, max(2, PRODUCERS))
LOAD_PROCESSES = PRODUCERS
WARM_CALLS = 3  # untimed calls before each batch size's timed ones


def run(scale: Scale, workdir: Path) -> PartResult:
    if reason := cuda_missing():
        raise Skipped(f"part G skipped: {reason}; it measures nothing without a GPU")
    gpu = torch.cuda.get_device_name(0)
    engine_rows = engine_table_rows(scale)
    result = PartResult("G", TITLE)
    pipeline_rows, result.profile = pipeline_points(scale, workdir, engine_rows)
    result.tables = [_engine_table(engine_rows), _pipeline_table(pipeline_rows)]
    result.targets = [
        Target(
            f"pipeline ÷ engine, jobs of {row['texts']} text(s) as {row['encoding']}, "
            f"{row['workers']} GPU workers",
            row["share"],
            0.5,
            True,
            f"{row['sentences_per_s']:,.0f} of {row['engine_per_s']:,.0f} sentences/s, "
            f"at {row['clients']} clients (the better of {', '.join(map(str, CONCURRENCIES))})",
            errors=row["errors"],
        )
        for row in best_rows(pipeline_rows)
    ]
    result.notes = [
        f"GPU: {gpu} (torch {torch.__version__}, CUDA {torch.version.cuda}).",
        f"Engine: one `run`+`finish` of prepared tokens (batch x {SEQ}), median of "
        f"{_iterations(scale)} calls; the pipeline: closed-loop clients over HTTP from "
        f"{LOAD_PROCESSES} load-generator process(es) to {PRODUCERS} producer process(es) on "
        "one port and "
        f"{' then '.join(map(str, WORKER_COUNTS))} worker processes sharing the GPU.",
    ]
    result.data = {"gpu": gpu, "engine": engine_rows, "pipeline": pipeline_rows}
    return result


def best_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """With the most workers, each load's row at the count of clients that served it best."""
    best: dict[tuple[int, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["texts"], row["encoding"])
        if row["workers"] == max(WORKER_COUNTS) and (
            key not in best or row["share"] > best[key]["share"]
        ):
            best[key] = row
    return list(best.values())


def _iterations(scale: Scale) -> int:
    return max(10, int(scale.seconds * 50))


def _engine(dtype: str, graphs: bool) -> TorchEngine:
    config = ModelRepository.load(MODEL_REPOSITORY).get("minilm")
    assert config is not None
    variant = config.variants["torch"]
    options = {**variant.parameters["torch"], "device": "cuda", "dtype": dtype}
    if not graphs:
        options["cuda_graphs"] = None
    variant = variant.model_copy(update={"parameters": {**variant.parameters, "torch": options}})
    config = config.model_copy(update={"variants": {**config.variants, "torch": variant}})
    engine = TorchEngine(config, "torch", str(ARTIFACT_DIR / "minilm"))
    engine.load()
    engine.warmup()
    return engine


def engine_table_rows(scale: Scale) -> list[dict[str, Any]]:
    """Median ms per engine call for every batch and mode (a new engine per mode, freed after)."""
    texts = sentences(max(BATCHES))
    timings: dict[str, dict[int, float]] = {}
    for label, dtype, graphs in MODES:
        engine = _engine(dtype, graphs)
        before = (engine.captures, engine.replays)
        timings[label] = _time_calls(engine, texts, scale)
        calls = len(BATCHES) * (WARM_CALLS + _iterations(scale))
        _check_graphs(label, engine, before, calls if graphs else 0)
        engine.close()
        torch.cuda.empty_cache()
    return [
        {
            "batch": batch,
            **{label: timings[label][batch] for label, _, _ in MODES},
            "graph_sentences_per_s": batch / timings["fp16 + graph"][batch] * 1000.0,
        }
        for batch in BATCHES
    ]


def _check_graphs(
    label: str, engine: TorchEngine, before: tuple[int, int], expected_replays: int
) -> None:
    """Refuse to report a mode's numbers unless it ran as labelled: every timed call a graph
    replay with CUDA graphs (none eager), none without, and no capture while timed."""
    captures, replays = engine.captures - before[0], engine.replays - before[1]
    if captures or replays != expected_replays:
        raise RuntimeError(
            f"{label}: {captures} graphs captured and {replays} replayed while timed, "
            f"expected 0 and {expected_replays}"
        )


def _time_calls(engine: TorchEngine, texts: list[str], scale: Scale) -> dict[int, float]:
    timings = {}
    for batch in BATCHES:
        tokens = engine.encoder.tokenize(texts[:batch], pad_to=SEQ)
        calls = [(tokens, batch)]
        prepared = PreparedBatch(JobSplit([batch], [False]).counted(calls), calls)
        timings[batch] = _median_ms(lambda p=prepared: engine.finish(engine.run(p)), scale)
    return timings


def _median_ms(call: Any, scale: Scale) -> float:
    for _ in range(WARM_CALLS):
        call()
    samples = []
    for _ in range(_iterations(scale)):
        began = time.perf_counter()
        call()
        samples.append((time.perf_counter() - began) * 1000.0)
    return statistics.median(samples)


def pipeline_points(
    scale: Scale, workdir: Path, engine_rows: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Sentences/s through the whole pipeline (HTTP, Redis, workers) for each load and each
    count of GPU workers, with the cores each process kept busy (one near 1.0 is the
    single-threaded limit); then a py-spy profile of the largest jobs' load with every worker,
    so a miss says where the time goes."""
    texts = sentences(1024, seed=1)
    points = []
    spawn = multiprocessing.get_context("spawn")
    with (
        running_stack(workdir, PRODUCERS) as stack,
        ProcessPoolExecutor(LOAD_PROCESSES, mp_context=spawn) as generators,
    ):
        producers = {
            name: p.pid for name, p in stack.processes.items() if name.startswith("producer")
        }
        workers: dict[str, int] = {}
        url = f"{stack.base_url}/v1/models/minilm/predict"
        for count in WORKER_COUNTS:
            while len(workers) < count:
                name = f"worker-{len(workers) + 1}"
                workers[name] = start_worker(stack, workdir, "minilm:torch", name, {})
            pids = {**producers, **workers, "valkey": stack.processes["valkey"].pid}
            clients = CONCURRENCIES if count == max(WORKER_COUNTS) else CONCURRENCIES[:1]
            for per_job, encoding in LOADS:
                for concurrency in clients:
                    load = Load(url, texts, per_job, encoding, concurrency)
                    point = _point(scale, generators, load, pids, engine_rows)
                    points.append({"workers": count, "encoding": encoding, **point})
        per_job = max(JOB_SIZES)
        profile = profile_during(
            {**producers, **workers, "load generator": os.getpid()},
            scale.profile_s,
            workdir / "profile",
            f"minilm:torch, jobs of {per_job} texts as numbers, {CONCURRENCIES[0]} clients, "
            f"{len(workers)} GPU workers",
            closed_loop(
                _job_target(url, texts, per_job, "float"),
                CONCURRENCIES[0],
                scale.profile_s,
                scale.max_requests,
            ),
        )
    return points, profile


@dataclass(frozen=True)
class Load:
    """One closed-loop load: what each generator process needs to build its own target."""

    url: str
    texts: list[str]
    per_job: int
    encoding: str
    clients: int


def _generate(load: Load, clients: int, seconds: float, scale: Scale) -> dict[str, Any]:
    """One generator process's share of a load (runs in a pool process)."""
    target = _job_target(load.url, load.texts, load.per_job, load.encoding)
    return closed_loop_run(target, clients, seconds, scale.max_requests)


def _point(
    scale: Scale,
    generators: ProcessPoolExecutor,
    load: Load,
    pids: dict[str, int],
    engine_rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """One closed-loop load's figures, against the engine at the micro-batch its jobs make."""
    engine_batch = JOB_SIZES[load.per_job]
    engine_per_s = next(
        r["graph_sentences_per_s"] for r in engine_rows if r["batch"] == engine_batch
    )
    shares = [load.clients // LOAD_PROCESSES] * LOAD_PROCESSES
    shares[0] += load.clients - sum(shares)

    def run_all(seconds: float) -> list[dict[str, Any]]:
        calls = [generators.submit(_generate, load, n, seconds, scale) for n in shares]
        return [call.result() for call in calls]

    run_all(scale.warmup_s)
    meter, began = CpuMeter(pids), time.time()
    threads = ThreadMeter({name: pid for name, pid in pids.items() if name.startswith("worker")})
    meter.start()
    threads.start()
    runs = run_all(scale.seconds)
    seconds = time.time() - began
    merged = MergedRuns.of(runs)
    jobs_per_s = merged.jobs_per_s
    busy = cores_busy(meter.stop(), seconds)
    busy["load generator"] = round(sum(run["cpu_s"] for run in runs) / seconds, 2)
    return {
        "texts": load.per_job,
        "clients": load.clients,
        "jobs_per_s": jobs_per_s,
        "sentences_per_s": jobs_per_s * load.per_job,
        "p50_ms": merged.percentile_ms(50),
        "errors": merged.errors,
        "engine_batch": engine_batch,
        "engine_per_s": engine_per_s,
        "share": ratio(jobs_per_s * load.per_job, engine_per_s),
        "cores_busy": busy,
        "worker_threads": threads.stop(seconds),
    }


def _job_target(url: str, texts: list[str], per_job: int, encoding: str) -> LoadTarget:
    bodies = [
        {
            "inputs": {"texts": texts[i : i + per_job], "encoding_format": encoding},
            "variant": "torch",
        }
        for i in range(0, len(texts), per_job)
    ]
    return LoadTarget.post(url, bodies)


def _spread(name: str, threads: dict[str, Any]) -> str:
    busiest = "/".join(f"{c:g}" for c in threads["busiest"])
    return f"{name} {busiest}; {threads['busy_threads']} of {threads['threads']}"


def _engine_table(rows: list[dict[str, Any]]) -> Table:
    labels = [label for label, _, _ in MODES]
    return Table(
        f"Engine in-process: ms per call (seq {SEQ})",
        ["batch", *(f"{label} ms" for label in labels), "fp16 + graph sentences/s"],
        [[r["batch"], *(r[label] for label in labels), r["graph_sentences_per_s"]] for r in rows],
    )


def _pipeline_table(rows: list[dict[str, Any]]) -> Table:
    return Table(
        "Pipeline serving minilm:torch",
        [
            "GPU workers",
            "clients",
            "texts per job",
            "encoding",
            "jobs/s",
            "sentences/s",
            "p50 ms",
            "engine limit /s",
            "pipeline ÷ engine",
            "cores busy",
            "worker threads: busiest cores; threads over 1 % of a core, of all",
        ],
        [
            [
                r["workers"],
                r["clients"],
                r["texts"],
                r["encoding"],
                r["jobs_per_s"],
                r["sentences_per_s"],
                r["p50_ms"],
                r["engine_per_s"],
                r["share"],
                ", ".join(f"{name} {cores:g}" for name, cores in r["cores_busy"].items()),
                ", ".join(_spread(name, t) for name, t in r["worker_threads"].items()),
            ]
            for r in rows
        ],
    )

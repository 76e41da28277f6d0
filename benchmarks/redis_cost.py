"""Part D, Redis cost: commands per job on the hot path, split into submit, worker and result
(INFO commandstats deltas, which include the commands Lua scripts run), and the worker's round
trips per micro-batch (top-level commands of the worker's own connections, from CLIENT LIST's
`tot-cmds`), which the design wants O(1) per batch, not O(jobs)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import redis

from benchmarks.celery_baseline import start_baseline
from benchmarks.load import LoadResult, closed_loop, drive
from benchmarks.load import Target as LoadTarget
from benchmarks.pipeline_stack import IDENTITY_PAYLOAD, running_stack, start_worker
from benchmarks.report import PartResult, Table, Target, ratio
from benchmarks.scales import Scale
from conveyor.stack import Stack
from shared.keys import Keys

TITLE = "Redis cost per job and per micro-batch"
CONCURRENCY = 32
STREAM = Keys().queue("identity", "default")


@dataclass
class Snapshot:
    at: float
    commands: Counter[str]
    # process name → {client id: top-level commands so far}
    clients: dict[str, dict[str, int]]


@dataclass
class Usage:
    seconds: float
    commands: Counter[str]
    by_process: Counter[str]

    def minus_idle(self, idle: Usage) -> Usage:
        """Take away what the idle processes would have sent in the same time (the worker's
        blocking read timing out, Celery's broker poll)."""
        scale = ratio(self.seconds, idle.seconds)
        return Usage(
            self.seconds,
            _positive({k: v - idle.commands[k] * scale for k, v in self.commands.items()}),
            _positive({k: v - idle.by_process[k] * scale for k, v in self.by_process.items()}),
        )


def _positive(counts: dict[str, float]) -> Counter[str]:
    return Counter({k: round(v, 1) for k, v in counts.items() if v > 0})


class RedisMeter:
    """What the server ran between snapshots, by command and by client process; the meter's
    own commands (INFO, CLIENT LIST, XLEN polls) are taken out."""

    def __init__(self, url: str, pids: dict[str, int]) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.pids = pids
        self.own: Counter[str] = Counter()

    def snapshot(self) -> Snapshot:
        stats = self.client.info("commandstats")
        commands = Counter(
            {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}
        )
        commands.subtract(self.own)
        self.own["info"] += 1
        clients = self.client.client_list()
        self.own["client|list"] += 1
        return Snapshot(time.perf_counter(), commands, self._by_process(clients))

    def _by_process(self, clients: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
        owner = {}
        for name, pid in self.pids.items():
            for connection in psutil.Process(pid).net_connections(kind="tcp"):
                owner[connection.laddr.port] = name
        grouped: dict[str, dict[str, int]] = {name: {} for name in self.pids}
        for client in clients:
            port = int(str(client["addr"]).rsplit(":", 1)[1])
            if port in owner:
                grouped[owner[port]][str(client["id"])] = int(client.get("tot-cmds", 0))
        return grouped

    def wait_empty(self, stream: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.own["xlen"] += 1
            if not self.client.xlen(stream):
                return
            time.sleep(0.02)
        raise TimeoutError(f"{stream} not drained after {timeout:.0f}s")

    def batches(self, job_ids: list[str]) -> Counter[str]:
        """Jobs per micro-batch (`batch_id` of each job's hash), read after the measurements."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(Keys().job(job_id), "batch_id")
        return Counter(batch for batch in pipe.execute() if batch)

    def close(self) -> None:
        self.client.close()


def usage(before: Snapshot, after: Snapshot) -> Usage:
    commands = Counter(after.commands)
    commands.subtract(before.commands)
    by_process: Counter[str] = Counter()
    for name, clients in after.clients.items():
        earlier = before.clients.get(name, {})
        by_process[name] = sum(n - earlier.get(cid, 0) for cid, n in clients.items())
    return Usage(after.at - before.at, _positive(dict(commands)), by_process)


def run(scale: Scale, workdir: Path) -> PartResult:
    with running_stack(workdir) as stack:
        worker = start_worker(stack, workdir, "identity:default", "identity", {})
        pids = {"producer": stack.processes["producer"].pid, "worker": worker}
        meter = RedisMeter(stack.redis_url, pids)
        try:
            _submit(stack, CONCURRENCY, 50)  # warm: pools open, scripts loaded
            meter.wait_empty(STREAM)
            idle = _idle(meter, scale)
            backlog = _backlog(stack, meter, worker, idle, scale)
            steady = _steady(stack, meter, idle, scale)
            celery = _celery(stack, meter, idle, scale)
            backlog["batches"] = meter.batches(backlog.pop("job_ids"))
            steady["batches"] = meter.batches(steady.pop("job_ids"))
        finally:
            meter.close()
    return summarise(idle, backlog, steady, celery)


def _idle(meter: RedisMeter, scale: Scale) -> Usage:
    before = meter.snapshot()
    time.sleep(max(1.0, scale.seconds / 2))
    return usage(before, meter.snapshot())


def _submit(stack: Stack, concurrency: int, jobs: int) -> LoadResult:
    body = {"model": "identity", **IDENTITY_PAYLOAD}
    target = LoadTarget.post(f"{stack.base_url}/v1/jobs", [body], ok=202)
    return drive(closed_loop(target, concurrency, 600.0, jobs))


def _backlog(
    stack: Stack, meter: RedisMeter, worker: int, idle: Usage, scale: Scale
) -> dict[str, Any]:
    """Phases apart: jobs submitted while the worker is stopped (SIGSTOP), then run as a backlog
    (so every read finds a full batch), then each result read once over HTTP."""
    os.kill(worker, signal.SIGSTOP)
    try:
        paused = meter.snapshot()
        submitted = _submit(stack, CONCURRENCY, scale.redis_jobs)
        queued = meter.snapshot()
    finally:
        os.kill(worker, signal.SIGCONT)
    meter.wait_empty(STREAM)
    done = meter.snapshot()
    paths = [f"/v1/jobs/{job_id}" for job_id in submitted.job_ids]
    drive(closed_loop(LoadTarget.get(stack.base_url, paths), CONCURRENCY, 600.0, len(paths)))
    read = meter.snapshot()
    # The stopped worker's pending blocking read is answered as soon as jobs arrive, so its
    # commands count from the pause; idle background only while it ran.
    worker_phase = usage(queued, done).minus_idle(idle)
    worker_phase.by_process["worker"] += usage(paused, queued).by_process["worker"]
    return {
        "jobs": submitted.completed,
        "job_ids": submitted.job_ids,
        "submit": usage(paused, queued),
        "worker": worker_phase,
        "result": usage(done, read).minus_idle(idle),
    }


def _steady(stack: Stack, meter: RedisMeter, idle: Usage, scale: Scale) -> dict[str, Any]:
    """Submit-and-wait requests in a closed loop: the worker's reads often find the stream
    empty and block, the realistic case below saturation."""
    target = LoadTarget.post(f"{stack.base_url}/v1/models/identity/predict", [IDENTITY_PAYLOAD])
    before = meter.snapshot()
    load = drive(closed_loop(target, CONCURRENCY, scale.seconds, scale.max_requests))
    meter.wait_empty(STREAM)
    spent = usage(before, meter.snapshot()).minus_idle(idle)
    return {"jobs": load.completed, "job_ids": load.job_ids, "all": spent}


def _celery(stack: Stack, meter: RedisMeter, idle: Usage, scale: Scale) -> dict[str, Any]:
    """The same jobs through the FastAPI + Celery baseline (broker and result backend), less
    Conveyor's idle background."""
    baseline_url, _ = start_baseline(stack, IDENTITY_PAYLOAD)
    target = LoadTarget.post(f"{baseline_url}/celery/predict", [IDENTITY_PAYLOAD])
    before = meter.snapshot()
    load = drive(closed_loop(target, CONCURRENCY, 600.0, scale.redis_jobs))
    return {"jobs": load.completed, "all": usage(before, meter.snapshot()).minus_idle(idle)}


def _per(counts: Counter[str], n: int) -> dict[str, float]:
    return {k: round(ratio(v, n), 3) for k, v in counts.most_common()}


def summarise(
    idle: Usage, backlog: dict[str, Any], steady: dict[str, Any], celery: dict[str, Any]
) -> PartResult:
    jobs = backlog["jobs"]
    phases = {name: backlog[name] for name in ("submit", "worker", "result")}
    per_job = {
        name: {
            "commands_per_job": round(ratio(u.commands.total(), jobs), 3),
            "round_trips_per_job": _per(u.by_process, jobs),
            "commands": _per(u.commands, jobs),
        }
        for name, u in phases.items()
    }
    micro = {
        "backlog": _per_batch(backlog["worker"], backlog["batches"]),
        f"closed loop c={CONCURRENCY}": _per_batch(steady["all"], steady["batches"]),
    }
    steady_all: Usage = steady["all"]
    celery_all: Usage = celery["all"]
    comparison = {
        "Conveyor submit-and-wait": round(ratio(steady_all.commands.total(), steady["jobs"]), 2),
        "FastAPI + Celery": round(ratio(celery_all.commands.total(), celery["jobs"]), 2),
    }
    backlog_batch = micro["backlog"]
    return PartResult(
        part="D",
        title=TITLE,
        tables=[
            _phase_table(per_job, jobs),
            _batch_table(micro),
            Table(
                f"All Redis commands per job, closed loop at concurrency {CONCURRENCY}",
                ["system", "commands/job"],
                [[k, v] for k, v in comparison.items()],
            ),
            Table(
                "Idle background (subtracted from the phases where the worker runs)",
                ["process", "top-level commands/s"],
                [[k, round(ratio(v, idle.seconds), 2)] for k, v in idle.by_process.items()],
            ),
        ],
        targets=[
            Target(
                "worker read round trips per micro-batch (backlog)",
                backlog_batch["read_per_batch"],
                1.0,
                higher_is_better=False,
                detail=f"{backlog_batch['batches']} batches of {backlog_batch['mean_batch']} jobs "
                "on average.",
            ),
            Target(
                "worker write-back round trips per micro-batch (backlog)",
                backlog_batch["write_back_per_batch"],
                1.0,
                higher_is_better=False,
                detail="one FINISH script per batch (counted by its XACK).",
            ),
        ],
        notes=[
            f"Backlog: {jobs} jobs submitted (POST /v1/jobs, concurrency {CONCURRENCY}) while the "
            "worker was stopped, run as a backlog once it continued, then each read back once "
            "(GET /v1/jobs/{id}). Commands per job count every command the server ran, including "
            "those inside Lua scripts; round trips count only what each process sent. Write-back "
            "round trips are the FINISH script calls (one XACK each); read round trips are the "
            "worker's other top-level commands.",
        ],
        data={
            "jobs": jobs,
            "phases": per_job,
            "micro_batches": micro,
            "commands_per_job": comparison,
            "idle_per_s": {k: ratio(v, idle.seconds) for k, v in idle.by_process.items()},
        },
    )


def _per_batch(spent: Usage, batches: Counter[str]) -> dict[str, Any]:
    count = len(batches)
    worker = spent.by_process["worker"]
    write_back = spent.commands["xack"]
    return {
        "batches": count,
        "mean_batch": round(ratio(batches.total(), count), 2),
        "round_trips_per_batch": round(ratio(worker, count), 3),
        "write_back_per_batch": round(ratio(write_back, count), 3),
        "read_per_batch": round(ratio(worker - write_back, count), 3),
    }


def _phase_table(per_job: dict[str, Any], jobs: int) -> Table:
    rows = []
    for phase, row in per_job.items():
        trips = ", ".join(f"{k} {v:g}" for k, v in row["round_trips_per_job"].items() if v)
        top = ", ".join(f"{k} {v:g}" for k, v in list(row["commands"].items())[:6])
        rows.append([phase, row["commands_per_job"], trips, top])
    return Table(
        f"Commands per job, phase by phase ({jobs} jobs)",
        ["phase", "commands/job", "round trips/job by process", "commands/job by name"],
        rows,
    )


def _batch_table(micro: dict[str, dict[str, Any]]) -> Table:
    keys = ["batches", "mean_batch", "round_trips_per_batch", "read_per_batch"]
    return Table(
        "Worker round trips per micro-batch",
        ["load", "batches", "mean batch", "round trips", "read", "write-back"],
        [[load, *(m[k] for k in keys), m["write_back_per_batch"]] for load, m in micro.items()],
    )

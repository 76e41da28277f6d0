"""Part D, Redis cost: commands per job on the hot path, split into submit, worker and result
(INFO commandstats deltas, which include the commands Lua scripts run), and round trips: every
top-level command each process sends (MONITOR, scripts named by their SHA), so the worker's reads
and write-backs per micro-batch are counted exactly; the design wants them O(1) per batch."""

from __future__ import annotations

import hashlib
import threading
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
from shared import job_scripts
from shared.keys import Keys

TITLE = "Redis cost per job and per micro-batch"
CONCURRENCY = 32
STREAM = Keys().queue("identity", "default")
WORKER, BACKLOG_WORKER = "identity", "identity-backlog"
# A TAKE of the bulk lane is labelled apart: after a full micro-batch the worker reads its
# preferred lane, else the other, in one TAKE; otherwise it blocks in one XREADGROUP.
READ = frozenset({"evalsha TAKE", "evalsha TAKE bulk", "xreadgroup"})
WRITE_BACK = frozenset({"evalsha FINISH"})
STOP = "conveyor-bench-monitor-stop"
SCRIPTS = {
    hashlib.sha1(text.encode()).hexdigest(): name
    for name, text in vars(job_scripts).items()
    if name.isupper() and isinstance(text, str)
}


@dataclass(frozen=True, slots=True)
class Command:
    at: float
    process: str
    pid: int
    label: str


class CommandLog:
    """Every top-level command the server receives, from MONITOR (commands run inside Lua
    scripts are listed apart by the server and skipped), attributed to the process whose
    connection sent it: each connection's local port, read at start, at stop, and whenever
    `read_owners()` is called (before stopping one of `pids`: gone by stop, it holds none)."""

    def __init__(self, url: str, pids: dict[str, int]) -> None:
        self.client = redis.Redis.from_url(url)
        self.pids = pids
        self._owners: dict[int, tuple[str, int]] = {}
        self._raw: list[tuple[float, int, str]] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._record, name="monitor", daemon=True)
        self.commands: list[Command] = []

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("MONITOR did not start")
        self.read_owners()

    def stop(self, sender: redis.Redis) -> None:
        """`sender` (another connection) sends the marker that ends the recording."""
        sender.echo(STOP)
        self._thread.join(60)
        self.read_owners()
        self.commands = [
            Command(at, *self._owners[port], label)
            for at, port, label in self._raw
            if port in self._owners
        ]
        self.client.close()

    def _record(self) -> None:
        with self.client.monitor() as monitor:
            self._ready.set()
            while True:
                line = monitor.connection.read_response()
                text = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
                if STOP in text:
                    return
                parsed = _parse(text)
                if parsed is not None:
                    self._raw.append(parsed)

    def read_owners(self) -> None:
        """Note which of `pids` holds each local port now (a later reading wins a port)."""
        for name, pid in self.pids.items():
            try:
                connections = psutil.Process(pid).net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                continue
            self._owners |= {c.laddr.port: (name, pid) for c in connections}

    def between(self, start: float, end: float, process: str | None = None) -> list[Command]:
        return [
            c
            for c in self.commands
            if start <= c.at <= end and (process is None or c.process == process)
        ]


def _parse(line: str) -> tuple[float, int, str] | None:
    """`1700000000.1 [0 127.0.0.1:5123] "EVALSHA" "<sha>" ...` → (time, port, label)."""
    stamp, _, rest = line.partition(" [")
    client, _, command = rest.partition("] ")
    address = client.partition(" ")[2]
    if ":" not in address:
        return None  # lua (inside a script) or a unix socket
    words = command.split('" "', 4)
    name = words[0].strip('"').lower()
    if name in ("evalsha", "evalsha_ro") and len(words) > 1:
        sha = words[1].strip('"')
        name = f"evalsha {SCRIPTS.get(sha, sha[:8])}"
        if len(words) > 3 and words[2] != "0" and words[3].endswith(":bulk"):
            name += " bulk"
    return float(stamp), int(address.rsplit(":", 1)[1]), name


# A snapshot: when, the commands run so far, and the append-only file's size and rewrites so far
# (None without an AOF).
Snapshot = tuple[float, Counter[str], tuple[int, int] | None]


class CommandStats:
    """INFO commandstats and persistence snapshots; the meter's own INFO, XLEN and ECHO calls
    are taken out."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.own: Counter[str] = Counter()

    def snapshot(self) -> Snapshot:
        stats = self.client.info("commandstats")
        persistence = self.client.info("persistence")
        at = time.time()
        calls = Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})
        calls.subtract(self.own)
        self.own["info"] += 2
        aof = None
        if persistence.get("aof_enabled"):
            aof = (int(persistence["aof_current_size"]), int(persistence["aof_rewrites"]))
        return at, calls, aof

    def wait_empty(self, stream: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.own["xlen"] += 1
            if not self.client.xlen(stream):
                return
            time.sleep(0.02)
        raise TimeoutError(f"{stream} not drained after {timeout:.0f}s")

    def batches(self, job_ids: list[str]) -> Counter[str]:
        """Jobs per micro-batch (each job hash's `batch_id`), read after the measurements."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(Keys().job(job_id), "batch_id")
        return Counter(batch for batch in pipe.execute() if batch)


@dataclass
class Window:
    """Commands the server ran between two snapshots (every one, scripts' included), and the
    bytes its append-only file grew by: what each write costs the server again, formatted and
    written to disk (None without an AOF, or with a rewrite between, which shrank the file)."""

    start: float
    end: float
    commands: Counter[str]
    aof_bytes: float | None = None

    @classmethod
    def of(cls, before: Snapshot, after: Snapshot) -> Window:
        commands = Counter(after[1])
        commands.subtract(before[1])
        grown = None
        if before[2] is not None and after[2] is not None and before[2][1] == after[2][1]:
            grown = after[2][0] - before[2][0]
        return cls(before[0], after[0], +commands, grown)

    def minus_idle(self, idle: Window) -> Window:
        """Take away what idle processes send in the same time (blocking reads timing out,
        Celery's broker poll), at the rate measured while nothing ran."""
        share = ratio(self.end - self.start, idle.end - idle.start)
        rest = {k: v - idle.commands[k] * share for k, v in self.commands.items()}
        aof = None
        if self.aof_bytes is not None and idle.aof_bytes is not None:
            aof = self.aof_bytes - idle.aof_bytes * share
        return Window(
            self.start, self.end, Counter({k: round(v) for k, v in rest.items() if v > 0}), aof
        )


def run(scale: Scale, workdir: Path) -> PartResult:
    with running_stack(workdir) as stack:
        worker = start_worker(stack, workdir, "identity:default", WORKER, {})
        stats = CommandStats(stack.redis_url)
        log = CommandLog(
            stack.redis_url, {"producer": stack.processes["producer"].pid, "worker": worker}
        )
        try:
            _submit(stack, 50)  # warm: pools open, scripts loaded
            stats.wait_empty(STREAM)
            log.start()
            idle = _idle(stats, scale)
            backlog = _backlog(stack, stats, log, idle, scale, workdir)
            steady = _steady(stack, stats, idle, scale)
            log.stop(stats.client)
            stats.own["echo"] += 1
            celery = _celery(stack, stats, idle, scale)
            for phase in (backlog, steady):
                phase["batches"] = stats.batches(phase.pop("job_ids"))
        finally:
            stats.client.close()
    return summarise(log, idle, backlog, steady, celery)


def _idle(stats: CommandStats, scale: Scale) -> Window:
    before = stats.snapshot()
    time.sleep(max(1.0, scale.seconds / 2))
    return Window.of(before, stats.snapshot())


def _submit(stack: Stack, jobs: int) -> LoadResult:
    body = {"model": "identity", **IDENTITY_PAYLOAD}
    target = LoadTarget.post(f"{stack.base_url}/v1/jobs", [body], ok=202)
    return drive(closed_loop(target, CONCURRENCY, 600.0, jobs))


def _backlog(
    stack: Stack, stats: CommandStats, log: CommandLog, idle: Window, scale: Scale, workdir: Path
) -> dict[str, Any]:
    """Phases apart: jobs submitted while no worker runs, then a worker started on the backlog
    (every read finds a full batch waiting), then each result read once over HTTP. (Stopping
    the worker with SIGSTOP instead loses the batch its blocked read was handed whenever the
    pause outlasts the client's socket timeout; those jobs then wait for reclaim.)"""
    log.read_owners()  # the idle window's worker: its commands there count as the worker's
    stack.stop_process(WORKER)
    empty = stats.snapshot()
    submitted = _submit(stack, scale.redis_jobs)
    queued = stats.snapshot()
    paths = [f"/v1/jobs/{job_id}" for job_id in submitted.job_ids]
    drive(closed_loop(LoadTarget.get(stack.base_url, paths), CONCURRENCY, 600.0, len(paths)))
    positioned = stats.snapshot()
    log.pids["worker"] = start_worker(stack, workdir, "identity:default", BACKLOG_WORKER, {})
    stats.wait_empty(STREAM)
    done = stats.snapshot()
    drive(closed_loop(LoadTarget.get(stack.base_url, paths), CONCURRENCY, 600.0, len(paths)))
    read = stats.snapshot()
    return {
        "jobs": submitted.completed,
        "job_ids": submitted.job_ids,
        "submit": Window.of(empty, queued),
        # Each queued job read once: its hash and its queue position (O(1), however long the
        # queue), less the producer's once-a-second drain-rate refresh.
        "position": Window.of(queued, positioned).minus_idle(idle),
        # Includes the worker's start (a few dozen commands: group, scripts, Celery's broker).
        "worker": Window.of(positioned, done).minus_idle(idle),
        "result": Window.of(done, read).minus_idle(idle),
    }


def _steady(stack: Stack, stats: CommandStats, idle: Window, scale: Scale) -> dict[str, Any]:
    """Submit-and-wait requests in a closed loop: below saturation the worker's reads often
    find the stream empty and block, so this is the realistic per-batch cost."""
    target = LoadTarget.post(f"{stack.base_url}/v1/models/identity/predict", [IDENTITY_PAYLOAD])
    before = stats.snapshot()
    load = drive(closed_loop(target, CONCURRENCY, scale.seconds, scale.max_requests))
    stats.wait_empty(STREAM)
    return {
        "jobs": load.completed,
        "job_ids": load.job_ids,
        "all": Window.of(before, stats.snapshot()).minus_idle(idle),
    }


def _celery(stack: Stack, stats: CommandStats, idle: Window, scale: Scale) -> dict[str, Any]:
    """The same jobs through the FastAPI + Celery baseline (broker and result backend), less
    Conveyor's idle background."""
    baseline_url, _ = start_baseline(stack, IDENTITY_PAYLOAD)
    target = LoadTarget.post(f"{baseline_url}/celery/predict", [IDENTITY_PAYLOAD])
    before = stats.snapshot()
    load = drive(closed_loop(target, CONCURRENCY, 600.0, scale.redis_jobs))
    return {"jobs": load.completed, "all": Window.of(before, stats.snapshot()).minus_idle(idle)}


def batch_round_trips(
    log: CommandLog, start: float, end: float, batches: Counter[str]
) -> dict[str, Any]:
    """The worker's top-level commands that served the batches run in [start, end]: up to its
    last write-back, plus the blocking read it was waiting in when the window opened (its own,
    not the last read of a worker stopped before it).
    `read_between_per_batch` counts only reads between its first and last write-back, per batch
    written there: the amortised cost once work is waiting, without the first batch's wake-up
    (a blocking read, then a claim) or the final empty read."""
    mine = log.between(start, end, "worker")
    finishes = sorted(c.at for c in mine if c.label in WRITE_BACK)
    served = [c for c in mine if finishes and c.at <= finishes[-1]]
    serving = {c.pid for c in mine}
    earlier = [c for c in log.commands if c.pid in serving and c.at < start]
    if finishes and earlier and earlier[-1].label in READ:
        served.append(earlier[-1])
    labels = Counter(c.label for c in served)
    count = len(batches)
    # No write-back seen (none of the worker's connections attributed to it): its round trips
    # went unmeasured, and the zero per batch they would read as was judged met.
    measured = count if finishes else 0
    reads = sum(n for label, n in labels.items() if label in READ)
    writes = sum(n for label, n in labels.items() if label in WRITE_BACK)
    between = [c for c in served if finishes[0] < c.at <= finishes[-1] and c.label in READ]
    return {
        "batches": count,
        "mean_batch": round(ratio(batches.total(), count), 2),
        # Unrounded: targets are judged on them; the table rounds them.
        "read_per_batch": ratio(reads, measured),
        "read_between_per_batch": ratio(len(between), max(len(finishes) - 1, 0)),
        "write_back_per_batch": ratio(writes, measured),
        "other_per_batch": ratio(labels.total() - reads - writes, measured),
        "by_command": {k: round(ratio(v, count), 3) for k, v in labels.most_common()},
    }


def _per_job(window: Window, trips: list[Command], jobs: int) -> dict[str, Any]:
    return {
        "commands_per_job": round(ratio(window.commands.total(), jobs), 3),
        "commands": {k: round(ratio(v, jobs), 3) for k, v in window.commands.most_common()},
        "round_trips_per_job": {
            k: round(ratio(v, jobs), 3) for k, v in Counter(c.label for c in trips).most_common()
        },
    }


def summarise(
    log: CommandLog,
    idle: Window,
    backlog: dict[str, Any],
    steady: dict[str, Any],
    celery: dict[str, Any],
) -> PartResult:
    jobs = backlog["jobs"]
    submit, worker, result = backlog["submit"], backlog["worker"], backlog["result"]
    position = backlog["position"]
    phases = {
        "submit (producer)": _per_job(
            submit, log.between(submit.start, submit.end, "producer"), jobs
        ),
        "read a queued job, with its position (producer)": _per_job(
            position, log.between(position.start, position.end, "producer"), jobs
        ),
        "worker": _per_job(worker, log.between(worker.start, worker.end, "worker"), jobs),
        "result (producer)": _per_job(
            result, log.between(result.start, result.end, "producer"), jobs
        ),
    }
    steady_window: Window = steady["all"]
    micro = {
        "backlog": batch_round_trips(log, worker.start, worker.end, backlog["batches"]),
        f"closed loop, concurrency {CONCURRENCY}": batch_round_trips(
            log, steady_window.start, steady_window.end, steady["batches"]
        ),
    }
    celery_window: Window = celery["all"]
    # Unrounded for the target (6.004 rounded to 6.0 read met against ≤ 6); shown to 0.01.
    comparison = {
        "Conveyor (submit and wait)": ratio(steady_window.commands.total(), steady["jobs"]),
        "FastAPI + Celery": ratio(celery_window.commands.total(), celery["jobs"]),
    }
    shown = {k: round(v, 2) for k, v in comparison.items()}
    aof = {
        "Conveyor (submit and wait)": _aof_per_job(steady_window, steady["jobs"]),
        "FastAPI + Celery": _aof_per_job(celery_window, celery["jobs"]),
    }
    idle_trips = Counter(c.process for c in log.between(idle.start, idle.end))
    idle_seconds = idle.end - idle.start
    backlog_batch = micro["backlog"]
    return PartResult(
        part="D",
        title=TITLE,
        tables=[
            _phase_table(phases, jobs),
            _batch_table(micro),
            Table(
                f"Every Redis command per job, closed loop at concurrency {CONCURRENCY}",
                ["system", "commands/job", "AOF bytes/job"],
                [[k, v, _shown(aof[k])] for k, v in shown.items()],
            ),
        ],
        targets=[
            Target(
                "worker read round trips per micro-batch (backlog)",
                backlog_batch["read_between_per_batch"],
                1.0,
                higher_is_better=False,
                detail=f"{backlog_batch['batches']} batches of {backlog_batch['mean_batch']} "
                f"jobs on average; {backlog_batch['read_per_batch']:.3g} counting the first "
                "batch's wake-up, "
                f"{micro[f'closed loop, concurrency {CONCURRENCY}']['read_per_batch']:.3g} "
                "under closed-loop load, where reads often find the stream empty and block.",
            ),
            Target(
                "Redis commands per submit-and-wait job (closed loop)",
                comparison["Conveyor (submit and wait)"],
                6.0,
                higher_is_better=False,
                detail=f"FastAPI + Celery: {shown['FastAPI + Celery']}; worker phase "
                f"(backlog): {phases['worker']['commands_per_job']} per job.",
            ),
            Target(
                "worker write-back round trips per micro-batch (backlog)",
                backlog_batch["write_back_per_batch"],
                1.0,
                higher_is_better=False,
                detail="FINISH script calls per batch.",
            ),
        ],
        notes=[
            f"Backlog: {jobs} jobs submitted (POST /v1/jobs, concurrency {CONCURRENCY}) while no "
            "worker ran, each read once while queued (GET /v1/jobs/{id}: the hash, then the "
            "POSITION script, whose XPENDING, XLEN and GET cost the same at any queue length), "
            "then a worker started on them (its start-up commands count in the worker "
            "phase), then each read back once (GET /v1/jobs/{id}). Closed loop: submit-and-wait "
            "requests, results delivered by pub/sub. Commands per job count every command the "
            "server ran, those "
            "inside Lua scripts included (INFO commandstats; idle background subtracted: "
            + ", ".join(f"{k} {v / idle_seconds:.1f}/s" for k, v in idle_trips.items())
            + "). Round trips count what each process itself sent (MONITOR); scripts are named "
            "by their SHA. The worker's reads are TAKE (read with the jobs' statuses, after "
            "a full micro-batch; `bulk` when the bulk lane is preferred) and XREADGROUP (idle "
            "or keeping up: it blocks and hands the jobs over, no claim follows); its "
            "write-back is FINISH. AOF bytes per job: how much the append-only file grew "
            "over the window (INFO persistence, idle growth subtracted): every write is "
            "formatted into it and written again.",
        ],
        data={
            "jobs": jobs,
            "phases": phases,
            "micro_batches": micro,
            "commands_per_job": shown,
            "aof_bytes_per_job": aof,
            "closed_loop_commands_per_job": {
                k: round(ratio(v, steady["jobs"]), 3)
                for k, v in steady_window.commands.most_common()
            },
            "idle_round_trips_per_s": {k: ratio(v, idle_seconds) for k, v in idle_trips.items()},
        },
    )


def _aof_per_job(window: Window, jobs: int) -> float | None:
    return None if window.aof_bytes is None else ratio(window.aof_bytes, jobs)


def _shown(value: float | None) -> str | int:
    return "n/a" if value is None else round(value)


def _phase_table(phases: dict[str, Any], jobs: int) -> Table:
    rows = []
    for phase, row in phases.items():
        trips = ", ".join(f"{k} {v:g}" for k, v in list(row["round_trips_per_job"].items())[:5])
        top = ", ".join(f"{k} {v:g}" for k, v in list(row["commands"].items())[:6])
        rows.append([phase, row["commands_per_job"], top, trips])
    return Table(
        f"Per job, phase by phase ({jobs} jobs)",
        ["phase", "commands/job", "commands/job by name", "round trips/job"],
        rows,
    )


def _batch_table(micro: dict[str, dict[str, Any]]) -> Table:
    keys = [
        "batches",
        "mean_batch",
        "read_per_batch",
        "read_between_per_batch",
        "write_back_per_batch",
        "other_per_batch",
    ]
    return Table(
        "Worker round trips per micro-batch",
        ["load", "batches", "mean batch", "read", "read, once work waits", "write-back", "other"],
        [[load, *(round(m[k], 3) for k in keys)] for load, m in micro.items()],
    )

"""The benchmark figures that decide a verdict, each on a small real input (no benchmark part
runs): CPU a reaped child spent, targets judged on unrounded numbers, MONITOR commands kept for a
process gone by the end of the recording, and a target without enough data for a verdict."""

from __future__ import annotations

import subprocess
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from benchmarks import run as bench_run
from benchmarks.pipeline_overhead import cpu_targets
from benchmarks.process_cpu import LOAD_GENERATOR, CpuMeter, per_request_ms
from benchmarks.redis_cost import Command, CommandLog, Window, batch_round_trips, summarise
from benchmarks.report import PartResult, Target, machine, write_part, write_report
from benchmarks.scales import SMOKE

# Spawns a child that burns ~0.4 s of CPU, waits for it (so its time moves into this process's
# children_user/system) and prints the CPU seconds the child counted itself.
PARENT = """
import subprocess, sys
burn = "import time\\nwhile time.process_time() < 0.4: pass\\nprint(time.process_time())"
print("ready", flush=True)
sys.stdin.readline()
child = subprocess.run([sys.executable, "-c", burn], capture_output=True, text=True, check=True)
print(child.stdout.strip(), flush=True)
sys.stdin.readline()
"""


def _talk(process: subprocess.Popen[str], line: str = "") -> str:
    assert process.stdin is not None and process.stdout is not None
    if line:
        process.stdin.write(line + "\n")
        process.stdin.flush()
    return process.stdout.readline().strip()


def test_a_child_reaped_within_the_window_counts_for_its_parent() -> None:
    """Valkey's AOF rewrite child ends within a window and Valkey reaps it: its CPU moved into
    the parent's children_user/system, which the meter never read, so it was lost."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert _talk(parent) == "ready"
        meter = CpuMeter({"parent": parent.pid})
        meter.start()
        child_cpu_s = float(_talk(parent, "go"))  # the child has exited and been reaped
        spent = meter.stop()["parent"]
        _talk(parent, "done")
    finally:
        parent.kill()
        parent.wait()
    assert child_cpu_s >= 0.4
    assert spent >= 0.8 * child_cpu_s, (spent, child_cpu_s)


def test_part_a_judges_the_cpu_budgets_on_unrounded_ms() -> None:
    """Per-request CPU ms were rounded to 0.001 ms before the budgets were judged: Valkey's
    0.0604 ms read 0.06, met against ≤ 0.06, and the summed 0.6004 read 0.6, met too."""
    seconds = {"producer": 0.3404, "worker": 0.1996, "valkey": 0.0604, LOAD_GENERATOR: 0.1}
    targets = {t.name.rsplit(", ", 1)[1]: t for t in cpu_targets(per_request_ms(seconds, 1000), 32)}
    assert targets["valkey"].measured == pytest.approx(0.0604) and not targets["valkey"].met
    summed = targets["all processes summed"]
    assert summed.measured == pytest.approx(0.6004)
    assert not summed.met
    assert targets["producer"].met


def _window(start: float, commands: int) -> Window:
    return Window(start, start + 1.0, Counter({"evalsha": commands}))


def test_part_d_judges_commands_per_job_unrounded() -> None:
    """Commands per job were rounded to 0.01 before the target read them: 6.004 read 6.0,
    met against ≤ 6."""
    batches: Counter[str] = Counter({"b1": 10})
    backlog: dict[str, Any] = {"jobs": 10, "batches": batches}
    backlog |= {phase: _window(n, 30) for n, phase in enumerate(("submit", "position", "worker"))}
    backlog["result"] = _window(3.0, 20)
    steady = {"jobs": 1000, "all": _window(4.0, 6004), "batches": batches}
    celery = {"jobs": 1000, "all": _window(5.0, 18000)}
    log = CommandLog("redis://127.0.0.1:1", {})  # no connection: its commands are given
    result = summarise(log, _window(-1.0, 0), backlog, steady, celery)
    [per_job] = [t for t in result.targets if "commands per submit-and-wait job" in t.name]
    assert per_job.measured == pytest.approx(6.004) and not per_job.met


# Holds one connection open, sends ECHO on request, then exits.
CLIENT = """
import redis, sys
client = redis.Redis.from_url(sys.argv[1])
client.ping()
print("ready", flush=True)
sys.stdin.readline()
client.echo("gone-before-stop")
"""


def test_commands_of_a_process_gone_by_stop_keep_their_owner(redis_url: str) -> None:
    """Part D's idle-window worker is stopped before the recording ends: its connections were
    mapped to it only at stop(), when it had none, so its commands were dropped."""
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, redis_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert _talk(client) == "ready"
        log = CommandLog(redis_url, {"worker": client.pid})
        log.start()
        _talk(client, "go")
        assert client.wait(30) == 0
    finally:
        client.kill()
        client.wait()
    sender = redis.Redis.from_url(redis_url)
    try:
        log.stop(sender)
    finally:
        sender.close()
    assert [c.label for c in log.commands if c.process == "worker"] == ["echo"]


def test_backlog_round_trips_leave_out_a_stopped_worker_s_last_read() -> None:
    """Once the idle-window worker's commands are kept, its last blocking read comes before the
    backlog window too; it served nothing there, so only the serving worker's count."""
    log = CommandLog("redis://127.0.0.1:1", {})
    log.commands = [
        Command(1.0, "worker", 100, "xreadgroup"),  # the worker stopped before the backlog
        Command(3.0, "worker", 200, "evalsha TAKE"),
        Command(3.1, "worker", 200, "evalsha FINISH"),
    ]
    trips = batch_round_trips(log, 2.0, 4.0, Counter({"b1": 5}))
    assert trips["read_per_batch"] == 1.0 and trips["write_back_per_batch"] == 1.0
    log.commands.insert(1, Command(1.5, "worker", 200, "xreadgroup"))  # its own, waiting
    assert batch_round_trips(log, 2.0, 4.0, Counter({"b1": 5}))["read_per_batch"] == 2.0


def test_a_target_without_a_measure_reads_no_verdict(tmp_path: Path) -> None:
    """Part F gives no verdict on a p99 of too few jobs (NaN measured), but the report printed
    it **missed**, as if the pipeline had failed the target."""
    unjudged = Target("B's p99 ÷ unloaded p99", float("nan"), 2.0, higher_is_better=False)
    missed = Target("another target", 3.0, 2.0, higher_is_better=False)
    assert not unjudged.met and unjudged.verdict().startswith("no verdict")
    result = PartResult(part="F", title="Fair queuing", targets=[unjudged, missed])
    write_part(result, tmp_path, "full", "2026-12-01 00:00:00 UTC", 1.0, machine())
    report = write_report(tmp_path).read_text()
    lines = [line for line in report.splitlines() if unjudged.name in line]
    assert len(lines) == 2  # the headline's row and the part's own line
    assert all("no verdict" in line and "missed" not in line for line in lines), lines
    assert report.count("**missed**") == 2  # the missed one still reads missed, twice


def test_parts_of_two_runs_at_one_commit_are_not_one_run(tmp_path: Path) -> None:
    """The report grouped parts by machine and commit: part A rerun an hour later at the same
    commit (on a quieter machine) read as measured in one run with the rest."""
    for part, run in (("A", "2026-12-01 10:00:00 UTC"), ("D", "2026-12-01 09:00:00 UTC")):
        result = PartResult(part=part, title=f"part {part}")
        write_part(result, tmp_path, "full", run, 1.0, machine(), run)
    report = write_report(tmp_path).read_text()
    assert "one run on one machine" not in report
    assert "(run of 2026-12-01 10:00:00 UTC)" in report
    assert "(run of 2026-12-01 09:00:00 UTC)" in report


def test_parts_run_one_call_each_under_one_run_name_are_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device session runs its parts one `benchmarks.run` call each (on-device.sh saves after
    every part): named by each call's start, they read as measured in different runs."""
    for part in ("A", "D"):
        module = types.ModuleType(f"stub_part_{part}")
        module.run = lambda scale, workdir, part=part: PartResult(part, f"part {part}")  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, module.__name__, module)
        monkeypatch.setitem(bench_run.PARTS, part, module.__name__)
    bench_run.run_parts(["A"], SMOKE, tmp_path, run_name="2026-12-01 10:00:00 UTC")
    bench_run.run_parts(["D"], SMOKE, tmp_path, run_name="2026-12-01 10:00:00 UTC")
    report = (tmp_path / "REPORT.md").read_text()
    assert "Ratios measured in one run on one machine" in report
    # named, as README's performance section quotes the run (tests/test_docs_benchmarks.py)
    assert "(run of 2026-12-01 10:00:00 UTC)" in report.split("\n\n", 2)[1]

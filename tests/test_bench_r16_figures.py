"""Benchmark figures that went unmeasured and were still reported as numbers: a process gone by
the end of a CPU window, and a worker whose write-backs MONITOR never attributed to it. Each
must read as no figure (NaN, 'n/a', no verdict), never as a cost the targets judge."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter

from benchmarks.process_cpu import CpuMeter
from benchmarks.redis_cost import Command, CommandLog, batch_round_trips

# Burns ~0.2 s of CPU, then waits to be killed.
BURNER = "import sys, time\nwhile time.process_time() < 0.2: pass\nprint('ready', flush=True)\n"
BURNER += "sys.stdin.readline()\n"


def test_cpu_of_a_process_gone_by_stop_is_not_measured() -> None:
    """A process alive at start() and gone at stop() read 0 at stop: its CPU until start came
    back negated, a negative CPU ms per job (and a lower summed cost, judged met)."""
    burner = subprocess.Popen(
        [sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert burner.stdout is not None and burner.stdout.readline().strip() == "ready"
        meter = CpuMeter({"gone": burner.pid})
        meter.start()
    finally:
        burner.kill()
        burner.wait()
    spent = meter.stop()
    assert math.isnan(spent["gone"]), spent
    assert spent["load generator"] >= 0


def _log(*commands: Command) -> CommandLog:
    log = CommandLog("redis://127.0.0.1:1", {})
    log.commands = list(commands)
    return log


def test_batch_round_trips_without_a_write_back_are_not_measured() -> None:
    """With no FINISH attributed to the worker in the window, the per-batch round trips read
    0.0 and -0.0 (judged met against ≤ 1), or, with its waiting read before the window, the
    part crashed on an empty list."""
    batches = Counter({"b1": 5, "b2": 5})
    for log in (
        _log(),
        _log(
            Command(1.5, "worker", 200, "xreadgroup"), Command(3.0, "worker", 200, "evalsha TAKE")
        ),
    ):
        trips = batch_round_trips(log, 2.0, 4.0, batches)
        for figure in ("read_per_batch", "read_between_per_batch", "write_back_per_batch"):
            assert math.isnan(trips[figure]), (figure, trips)
        assert trips["batches"] == 2 and trips["mean_batch"] == 5.0


def test_batch_round_trips_with_write_backs_still_count_them() -> None:
    """The guard leaves a measured window as it was: reads and write-backs per batch."""
    log = _log(
        Command(1.5, "worker", 200, "xreadgroup"),
        Command(3.0, "worker", 200, "evalsha FINISH"),
        Command(3.1, "worker", 200, "evalsha TAKE"),
        Command(3.2, "worker", 200, "evalsha FINISH"),
    )
    trips = batch_round_trips(log, 2.0, 4.0, Counter({"b1": 5, "b2": 5}))
    assert trips["read_per_batch"] == 1.0 and trips["write_back_per_batch"] == 1.0
    assert trips["read_between_per_batch"] == 1.0

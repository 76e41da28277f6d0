"""CPU time each process spends per request: on a small shared machine wall-clock throughput
drifts with the neighbours, but CPU milliseconds per request show which process costs what."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import psutil

# The closed-loop clients' own processes: on the pipeline's cores, so their CPU is reported.
LOAD_GENERATOR = "load generator"


def _members(pid: int, children: bool) -> list[psutil.Process]:
    """A process, and its children when asked (the embedded Valkey's launcher runs the server
    binary as a child); none once it is gone."""
    try:
        process = psutil.Process(pid)
        return [process, *(process.children(recursive=True) if children else [])]
    except psutil.NoSuchProcess:
        return []


def _cpu_s(pid: int, children: bool) -> float:
    """User + system seconds of a process, and of its children when asked: those alive, and
    those already exited and reaped, whose time the kernel moved into their parent's
    children_user/system (a child forked and reaped within the window, as Valkey's AOF rewrite,
    was otherwise lost, and one alive at the start and gone at the stop subtracted). NaN once
    the process itself is gone: its time went with it, and the difference from a reading taken
    while it ran was its whole CPU until then, negated (a negative cost per job)."""
    members = _members(pid, children)
    if not members:
        return math.nan
    total = 0.0
    for member in members:
        try:
            times = member.cpu_times()
        except psutil.NoSuchProcess:
            if member.pid == pid:  # gone since it was listed
                return math.nan
            continue
        total += times.user + times.system
        if children:
            total += times.children_user + times.children_system
    return total


class CpuMeter:
    """CPU seconds used by named processes between `start()` and `stop()`; the load generator
    (this process) is always counted as `load generator`."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self._before: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        # The load generator's children are the servers themselves: count it alone.
        now = {name: _cpu_s(pid, children=True) for name, pid in self.pids.items()}
        return {**now, "load generator": _cpu_s(os.getpid(), children=False)}

    def start(self) -> None:
        self._before = self._now()

    def stop(self) -> dict[str, float]:
        return {name: value - self._before[name] for name, value in self._now().items()}


class ThreadMeter:
    """How each named process's CPU spread over its threads between `start()` and `stop()`: one
    thread near a whole core is a single-threaded limit; many threads each using a little is a
    thread pool spinning while it waits (the tokenizer's rayon pool, OpenMP), which a Python
    profiler does not see, since those threads run no Python. A thread that ends within the
    window is not counted: meant for a server's long-lived pools."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self._before: dict[str, dict[int, float]] = {}

    @staticmethod
    def _threads(pid: int) -> dict[int, float]:
        """CPU seconds of each thread of the process and of its children."""
        seconds: dict[int, float] = {}
        for member in _members(pid, children=True):
            try:
                seconds |= {t.id: t.user_time + t.system_time for t in member.threads()}
            except psutil.NoSuchProcess:
                continue
        return seconds

    def start(self) -> None:
        self._before = {name: self._threads(pid) for name, pid in self.pids.items()}

    def stop(self, seconds: float, top: int = 3) -> dict[str, dict[str, Any]]:
        """Per process: the `top` busiest threads' cores, and how many threads used over 1 %
        of a core, of how many."""
        spread = {}
        for name, pid in self.pids.items():
            before = self._before.get(name, {})
            after = self._threads(pid)
            cores = sorted(
                ((s - before.get(t, 0.0)) / seconds for t, s in after.items()), reverse=True
            )
            spread[name] = {
                "busiest": [round(c, 3) for c in cores[:top]],
                "busy_threads": sum(1 for c in cores if c > 0.01),
                "threads": len(cores),
            }
        return spread


def per_request_ms(cpu_s: Mapping[str, float], requests: int) -> dict[str, float]:
    """CPU milliseconds per completed request, by process, unrounded: targets are judged on
    these (0.0604 rounded to 0.06 read met against ≤ 0.06); tables round them for display."""
    if requests <= 0:
        return {name: float("nan") for name in cpu_s}
    return {name: seconds * 1000.0 / requests for name, seconds in cpu_s.items()}


def cores_busy(cpu_s: Mapping[str, float], seconds: float) -> dict[str, float]:
    """CPU seconds over wall seconds, by process: near 1.0, a single-threaded process is what
    limits the load."""
    return {name: round(spent / seconds, 2) for name, spent in cpu_s.items()}


def busy_share(before: Any, after: Any) -> float:
    """Share of all cores' time not idle between two `psutil.cpu_times()`: near 1, the
    machine (pipeline, load generators and neighbours together) is what limits the step."""
    spent = {field: getattr(after, field) - getattr(before, field) for field in after._fields}
    total = sum(spent.values())
    idle = spent["idle"] + spent.get("iowait", 0.0)
    return round(1.0 - idle / total, 3) if total > 0 else float("nan")

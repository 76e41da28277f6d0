"""Samples the pipeline's processes with py-spy while a load runs, so each part's report says
where the time goes (which functions are on the CPU), not only how fast it was."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any

from benchmarks.load import drive

PY_SPY = Path(sys.executable).parent / "py-spy"
TOP = 12
_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME = re.compile(r"^.* \((?P<file>[^():]+)(:\d+)?\)$")


class Sampler:
    """`with Sampler(pids, seconds, out_dir) as sampler:` run a load inside; on exit each
    process's samples are summarised into `sampler.profiles` (an error string where py-spy
    could not attach, e.g. without ptrace permission)."""

    def __init__(self, pids: dict[str, int], seconds: float, out_dir: Path) -> None:
        self.pids = pids
        self.seconds = seconds
        self.out_dir = out_dir
        self.runs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self.profiles: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> Sampler:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in self.pids.items():
            self._start(name, pid)
        return self

    def _start(self, name: str, pid: int) -> None:
        output = self.out_dir / f"{name.replace(' ', '-')}.txt"
        duration = str(max(1, round(self.seconds)))
        command = [str(PY_SPY), "record", "--pid", str(pid), "--duration", duration]
        command += ["--rate", "100", "--format", "raw", "--function", "--nonblocking"]
        try:
            process = subprocess.Popen(
                [*command, "--output", str(output)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        except OSError as exc:  # py-spy not installed (the `bench` extra)
            self.profiles[name] = {"error": f"py-spy did not start: {exc}"}
            return
        self.runs[name] = (process, output)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for name, (process, output) in self.runs.items():
            try:
                log, _ = process.communicate(timeout=self.seconds + 60)
            except subprocess.TimeoutExpired:
                process.kill()
                log, _ = process.communicate()
            if process.returncode == 0 and output.is_file():
                self.profiles[name] = summarise(output.read_text())
            else:
                tail = log.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                self.profiles[name] = {"error": f"py-spy exited {process.returncode}: {tail[0]}"}


def summarise(raw: str) -> dict[str, Any]:
    """py-spy's collapsed stacks → where the CPU went, as shares of all samples: by function
    (own time, the innermost frame) and by package (own time grouped by the frame's file's
    top folder: `fastapi`, `redis`, `asyncio`, `producer_api`, ...)."""
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    samples = 0
    for line in raw.splitlines():
        match = _LINE.match(line.strip())
        if not match:
            continue
        count = int(match["count"])
        leaf = match["stack"].split(";")[-1]
        samples += count
        own[leaf] += count
        packages[_package(leaf)] += count

    def shares(counter: Counter[str]) -> list[list[Any]]:
        return [[name, round(n / samples, 4)] for name, n in counter.most_common(TOP)]

    if not samples:
        return {"samples": 0, "self": [], "packages": []}
    return {"samples": samples, "self": shares(own), "packages": shares(packages)}


def _package(frame: str) -> str:
    """`post (httpx/_client.py:10)` → `httpx`; `wait (threading.py:295)` → `threading`."""
    match = _FRAME.match(frame)
    if not match:
        return frame
    return match["file"].split("/", 1)[0].removesuffix(".py")


def profile_during(
    pids: dict[str, int], seconds: float, out_dir: Path, label: str, load: Coroutine[Any, Any, Any]
) -> dict[str, Any]:
    """Sample `pids` while `load` runs (the load should last about `seconds`)."""
    with Sampler(pids, seconds, out_dir) as sampler:
        drive(load)
    return {"load": label, "processes": sampler.profiles}

"""`python -m benchmarks.run [--parts A,B,D] [--quick]`: runs the parts, prints their tables,
writes `results/<part>.json` and rebuilds `results/REPORT.md` (what `make bench` runs).

Each part is one module with `run(scale, workdir) -> PartResult`; adding a part (C, LLM
streaming, once the LLM path exists) is one module and one line in PARTS."""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from benchmarks.report import (
    REPO_ROOT,
    RESULTS_DIR,
    PartResult,
    Skipped,
    machine,
    print_part,
    started_now,
    write_part,
    write_report,
)
from benchmarks.scales import FULL, QUICK, SCALES, Scale

PARTS = {
    "A": "benchmarks.pipeline_overhead",
    "B": "benchmarks.batching_efficiency",
    "C": "benchmarks.llm_streaming",
    "D": "benchmarks.redis_cost",
    "E": "benchmarks.scaling",
    "EC": "benchmarks.cluster_scaling",
    "F": "benchmarks.fairness",
    "G": "benchmarks.gpu_engine",
}


def run_parts(parts: list[str], scale: Scale, results_dir: Path, run_name: str = "") -> list[Path]:
    """Run `parts` in order at `scale`; returns the JSON files written. `run_name` names the run in
    each part's document (default: when this call began): a caller that runs the parts of one
    run one call at a time (benchmarks/device/on-device.sh) names them all alike."""
    # Workers and the baseline run as subprocesses that import from the checkout.
    os.chdir(REPO_ROOT)
    console = Console()
    written = []
    run_began = run_name or started_now()
    for part in parts:
        module = importlib.import_module(PARTS[part])
        run: Callable[[Scale, Path], PartResult] = module.run
        # the machine as the part finds it: a load average read after it is mostly its own
        started, at_start, begin = started_now(), machine(), time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix=f"conveyor-bench-{part}-") as workdir:
                result = run(scale, Path(workdir))
        except Skipped as skipped:
            console.print(f"[yellow]{skipped}[/]")
            continue
        print_part(result, console)
        written.append(
            write_part(
                result,
                results_dir,
                scale.name,
                started,
                time.perf_counter() - begin,
                at_start,
                run_began,
            )
        )
    if written:
        report = write_report(results_dir)
        console.print(f"wrote {', '.join(str(p) for p in written)} and {report}")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated, e.g. A,D")
    parser.add_argument(
        "--quick", action="store_true", help="the quick scale (a look, not a result)"
    )
    parser.add_argument("--scale", choices=sorted(SCALES), help="overrides --quick")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--run", default="", help="name of the run the parts belong to (default: now)"
    )
    args = parser.parse_args(argv)
    parts = [p.strip().upper() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {sorted(PARTS)}")
    scale = SCALES[args.scale] if args.scale else (QUICK if args.quick else FULL)
    run_parts(parts, scale, args.results_dir.resolve(), args.run)


if __name__ == "__main__":
    main()

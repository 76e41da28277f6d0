"""The README says what the code does: its metrics table lists exactly the Prometheus families
the project exports, so a new counter cannot ship undocumented and a removed one cannot linger."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shared", "producer_api", "workers", "conveyor", "autoscaling")
# prometheus_client's constructor → the suffix its exposition adds to a family's name.
SUFFIXES = {"Counter": "_total", "Gauge": "", "Histogram": "", "Summary": "", "Info": "_info"}
TABLE_ROW = re.compile(r"^\| `(conveyor_\w+)", re.MULTILINE)


def _constructor(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def exported_families() -> Iterator[str]:
    """Names as a scrape shows them, read from every `Counter("conveyor_…", …)`-like call in
    the project's source: parsing, not importing, so no engine library is loaded."""
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                name, kind = node.args[0], _constructor(node)
                if (
                    kind in SUFFIXES
                    and isinstance(name, ast.Constant)
                    and isinstance(name.value, str)
                    and name.value.startswith("conveyor_")
                ):
                    yield name.value + SUFFIXES[kind]


def test_readme_metrics_table_lists_every_exported_metric_family() -> None:
    exported = set(exported_families())
    assert {"conveyor_jobs_submitted_total", "conveyor_partition_lag"} <= exported  # parsed
    documented = set(TABLE_ROW.findall((REPO_ROOT / "README.md").read_text()))
    assert sorted(exported - documented) == [], "exported, missing from README's metrics table"
    assert sorted(documented - exported) == [], "in README's metrics table, never exported"

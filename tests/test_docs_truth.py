"""The README says what the code does: its metrics table lists exactly the Prometheus families
the project exports, so a new counter cannot ship undocumented and a removed one cannot linger;
its configuration table names every variable the CLI reads, and its paths are the CLI's own."""

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
CONFIG_SECTION = re.compile(r"^## Configuration\n.*?^## ", re.MULTILINE | re.DOTALL)
CONFIG_ROW_NAMES = re.compile(r"^\| ([^|]+)", re.MULTILINE)  # a row's first cell
CONFIG_NAME = re.compile(r"`(CONVEYOR_\w+)`")


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


def _env_name(node: ast.AST) -> str | None:
    """The variable a `os.environ.get("X")` call or a click `envvar="X"` keyword reads."""
    if isinstance(node, ast.keyword) and node.arg == "envvar":
        value = node.value
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and ast.unparse(node.func.value) == "os.environ"
        and node.args
    ):
        value = node.args[0]
    else:
        return None
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None


def cli_env_reads() -> set[str]:
    """`CONVEYOR_` variables read under conveyor/ (CLI and SDK), besides shared/settings.py's."""
    names = set()
    for path in (REPO_ROOT / "conveyor").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = _env_name(node)
            if name is not None and name.startswith("CONVEYOR_"):
                names.add(name)
    return names


def test_readme_configuration_tables_list_every_variable_the_cli_reads() -> None:
    read = cli_env_reads()
    assert {"CONVEYOR_URL", "CONVEYOR_API_KEY", "CONVEYOR_REDIS_URL"} <= read  # parsed
    section = CONFIG_SECTION.search((REPO_ROOT / "README.md").read_text())
    assert section is not None, "README lost its Configuration section"
    cells = CONFIG_ROW_NAMES.findall(section.group())
    documented = {name for cell in cells for name in CONFIG_NAME.findall(cell)}
    assert "CONVEYOR_REDIS_URL" in documented  # parsed
    assert sorted(read - documented) == [], "read by the CLI, in no table of README's Configuration"


def test_readme_names_autoscales_log_directory() -> None:
    """`conveyor autoscale` logs under its own --state-dir, not CONVEYOR_STATE_DIR."""
    from conveyor.commands.autoscale import command

    (state_dir,) = (p.default for p in command.params if p.name == "state_dir")
    assert f"`{state_dir}/<worker>.log`" in (REPO_ROOT / "README.md").read_text()


def test_readme_says_the_hpa_caps_the_stabilization_window() -> None:
    """KEDA rendering caps `cooldown_s` at the HPA's longest window; README said it was all."""
    from autoscaling.keda import _HPA_MAX_WINDOW_S

    readme = (REPO_ROOT / "README.md").read_text()
    assert readme.count(f"`cooldown_s`, at most {_HPA_MAX_WINDOW_S} s") == 1  # local autoscaler
    assert f"`cooldown_s` (at most {_HPA_MAX_WINDOW_S} s" in readme  # KEDA

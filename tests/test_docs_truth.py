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


def _labels(call: ast.Call) -> set[str]:
    """A metric's label names besides a partition's `model` and `variant` (`PARTITION`)."""
    given = [k.value for k in call.keywords if k.arg == "labelnames"] or call.args[2:3]
    names = ast.walk(given[0]) if given else ()
    return {n.value for n in names if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def exported_families() -> Iterator[tuple[str, str, set[str]]]:
    """(name as a scrape shows it, its type, its own labels) of every `Counter("conveyor_…",
    …)`-like call in the project's source: parsing, not importing, so no engine library loads."""
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
                    yield name.value + SUFFIXES[kind], kind.lower(), _labels(node)


def test_readme_metrics_table_lists_every_exported_metric_family() -> None:
    families = {name: (kind, labels) for name, kind, labels in exported_families()}
    assert families["conveyor_jobs_rejected_total"] == ("counter", {"reason"})  # parsed
    readme = (REPO_ROOT / "README.md").read_text()
    documented = set(TABLE_ROW.findall(readme))
    assert sorted(families.keys() - documented) == [], "exported, missing from README's table"
    assert sorted(documented - families.keys()) == [], "in README's metrics table, never exported"
    rows = re.findall(r"^\| `(conveyor_\w+)(?:\{([\w,]+)\})?` \| (\w+) \|", readme, re.M)
    wrong = [
        f"{name}{{{labels}}} {kind}: exported as {families[name][0]} with {families[name][1]}"
        for name, labels, kind in rows
        if kind != families[name][0] or set(filter(None, labels.split(","))) != families[name][1]
    ]
    assert wrong == [], "README's metrics table gives a type or labels other than the code's"


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


MODEL_SECTION = re.compile(r"^## Model repository\n.*?^## ", re.MULTILINE | re.DOTALL)
PARENTHESES = re.compile(r"\([^()]*\)")


def _top_level(text: str) -> str:
    """`text` without its parenthesised asides (nested too): a row's own list, not its notes."""
    while (stripped := PARENTHESES.sub("", text)) != text:
        text = stripped
    return text


def _split_defaults(cell: str) -> list[str]:
    """A default cell's comma-separated values, commas inside parentheses left alone."""
    values, depth, start = [], 0, 0
    for index, char in enumerate(cell):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            values.append(cell[start:index].strip())
            start = index + 1
    return [*values, cell[start:].strip()]


def _written(default: object) -> str:
    """A config.yaml default as the README's tables write it (YAML's `false`, `2` for 2.0)."""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    return str(default)


def model_config_rows() -> Iterator[tuple[str, str, object]]:
    """(field path, README's default, the code's default) for each scalar default the Model
    repository tables give: a `| field | meaning | default |` row for one field, or a row for a
    group (`queue`, `autoscaling`) listing its fields in the meaning cell and their defaults,
    in order, in the default cell."""
    from pydantic import BaseModel

    from shared.model_repository import ModelConfig, TorchOptions

    section = MODEL_SECTION.search((REPO_ROOT / "README.md").read_text())
    assert section is not None, "README lost its Model repository section"
    tables: dict[str, type[BaseModel]] = {"field": ModelConfig, "option": TorchOptions}
    table: type[BaseModel] | None = None
    for line in section.group().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if not line.startswith("|"):
            table = None
        elif cells[0] in tables:  # a table's header row says whose fields it lists
            table = tables[cells[0]]
        head = re.fullmatch(r"`([\w.]+)`", cells[0])
        if table is None or head is None:
            continue
        model, fields = table, head.group(1).split(".")
        for name in fields[:-1]:
            model = model.model_fields[name].annotation  # type: ignore[assignment]
        info = model.model_fields[fields[-1]]  # a KeyError: a row for a key the code dropped
        group = info.default_factory if isinstance(info.default_factory, type) else None
        if group is not None and issubclass(group, BaseModel):  # a group's row
            names = re.findall(r"`(\w+)`", _top_level(cells[1]))
            defaults = _split_defaults(cells[2])
            assert len(names) == len(defaults), f"{cells[0]}: {names} against {defaults}"
            for name, shown in zip(names, defaults, strict=True):
                yield f"{head.group(1)}.{name}", shown, group.model_fields[name].default
        else:
            yield head.group(1), cells[2], info.default


def test_readme_model_repository_tables_give_the_codes_defaults() -> None:
    """A config.yaml default changed in shared/model_repository.py (or a table's order slipping
    against its list of fields) fails here, not in a user's capacity plan."""
    rows = list(model_config_rows())
    assert ("queue.max_length", "10000", 10_000) in rows  # parsed
    assert ("tokenizer_threads", "2", 2) in rows  # the torch table's too
    wrong = [
        f"{path}: README {shown!r}, code {_written(default)!r}"
        for path, shown, default in rows
        if isinstance(default, bool | int | float | str)
        and not re.fullmatch(rf"`?{re.escape(_written(default))}`?", shown)
    ]
    assert wrong == [], "README Model repository disagrees with shared/model_repository.py"


def test_readme_model_repository_names_every_config_field() -> None:
    """A config.yaml key the code accepts but the README never names is a knob nobody finds."""
    from shared.model_repository import (
        AutoscalingHints,
        BacklogScaling,
        ModelConfig,
        QueueLimits,
        TorchOptions,
        Variant,
    )

    section = MODEL_SECTION.search((REPO_ROOT / "README.md").read_text())
    assert section is not None
    internal = {"name", "directory"}  # the model's folder, not keys of its config.yaml
    models = (ModelConfig, QueueLimits, AutoscalingHints, BacklogScaling, Variant, TorchOptions)
    missing = [
        f"{model.__name__}.{field}"
        for model in models
        for field in model.model_fields
        if field not in internal and not re.search(rf"\b{field}\b", section.group())
    ]
    assert missing == [], "config.yaml fields the README's Model repository never names"


def key_name_parts() -> Iterator[tuple[str, str]]:
    """(Keys method or suffix constant, a fixed part of the names it makes): each name made with
    every argument a placeholder, split at the placeholders (and a partition's tag, a hash)."""
    import inspect

    from shared import keys as key_module

    blank = "\0"
    made = key_module.Keys("cv:")
    for name, member in inspect.getmembers(key_module.Keys):
        if name.startswith("_") or name in ("tag", "prefix"):
            continue
        if isinstance(inspect.getattr_static(key_module.Keys, name), property):
            names = getattr(made, name)
        else:
            arity = len(inspect.signature(member).parameters) - 1
            names = getattr(made, name)(*[blank] * arity)
        for key in names if isinstance(names, tuple) else (names,):
            key = key.replace(key_module.Keys.tag(blank, blank), blank)
            for part in (part.strip("{}") for part in key.split(blank)):  # a tag's braces
                if sum(char.isalpha() for char in part) >= 2:
                    yield name, part
    for name, value in vars(key_module).items():
        if name.endswith("_SUFFIX"):
            yield name, value


def test_architecture_data_plane_names_every_redis_key() -> None:
    """docs/architecture.md's data plane is the design of record of what lives in Redis: a key
    shared/keys.py starts making must get its row (what it holds, who writes and reads it)."""
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    parts = list(key_name_parts())
    assert ("tokens", "cv:tok:") in parts  # parsed
    assert ("REFUSED_SUFFIX", ":refused") in parts
    missing = sorted({f"{name}: {part!r}" for name, part in parts if part not in text})
    assert missing == [], "Redis keys docs/architecture.md's data plane never names"


SCRIPTS_SECTION = re.compile(r"^## Lua scripts.*?(?=^## )", re.MULTILINE | re.DOTALL)
SCRIPT_HOMES = ("shared", "producer_api", "workers")


def lua_scripts() -> Iterator[tuple[str, str]]:
    """(file name, script name without its leading `_`) of each module-level Lua script: a
    string that calls Redis and that no other script contains (those are shared fragments)."""
    import importlib

    found: list[tuple[str, str, str]] = []
    for package in SCRIPT_HOMES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            if "redis.call(" not in path.read_text():
                continue
            module = importlib.import_module(
                ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
            )
            source = path.read_text()
            found += [
                (path.name, name.lstrip("_"), value)
                for name, value in vars(module).items()
                if name.lstrip("_").isupper()
                and isinstance(value, str)
                and "redis.call(" in value
                and re.search(rf"^{name}\b.* = ", source, re.MULTILINE)  # its own, not imported
            ]
    for file, name, value in found:
        if not any(other != value and value in other for *_, other in found):
            yield file, name


def documented_scripts() -> set[tuple[str, str]]:
    """(file name, script) of each row of docs/architecture.md's script tables: the row's own
    `file.py`, else its table's heading's."""
    section = SCRIPTS_SECTION.search((REPO_ROOT / "docs" / "architecture.md").read_text())
    assert section is not None, "docs/architecture.md lost its Lua scripts section"
    rows, heading = set(), ""
    for line in section.group().splitlines():
        if line.startswith("### "):
            heading = (re.findall(r"`[\w/]*?(\w+\.py)`", line) or [""])[0]
        elif line.startswith("| ") and not line.startswith("| script |"):
            cell = line.split(" | ")[0]
            files = re.findall(r"`[\w/]*?(\w+\.py)`", cell) or [heading]
            rows |= {(files[0], name) for name in re.findall(r"\b[A-Z][A-Z_]+\b", cell)}
    return rows


def test_architecture_script_tables_name_every_lua_script() -> None:
    """A Lua script is a step no client sees half done: the design of record says what each one
    keeps true (15 of shared/'s, and the producer's and worker's own, had no row)."""
    scripts = set(lua_scripts())
    assert {("job_scripts.py", "FINISH"), ("canary_store.py", "START")} <= scripts  # parsed
    assert ("job_scripts.py", "LUA_FIELD") not in scripts  # a fragment, not a script
    missing = sorted(scripts - documented_scripts())
    assert missing == [], "Lua scripts docs/architecture.md's script tables never name"


def test_docs_name_only_config_keys_the_code_reads() -> None:
    """A `queue.…` or `autoscaling.…` key any doc names resolves in ModelConfig: a renamed key
    left behind in prose sends an operator to write one that load refuses."""
    from shared.model_repository import ModelConfig

    wrong, seen = [], set()
    for doc in ("README.md", "docs/architecture.md", "docs/redis-cluster.md"):
        text = (REPO_ROOT / doc).read_text()
        named = set(re.findall(r"`((?:queue|autoscaling)(?:\.\w+)+)(?::[^`]*)?`", text))
        seen |= named
        for path in named:
            model: object = ModelConfig
            for part in path.split("."):
                fields = getattr(model, "model_fields", {})
                if part not in fields:
                    wrong.append(f"{doc}: {path}")
                    break
                model = fields[part].annotation
    assert {"queue.admit_by_deadline", "autoscaling.backlog.cost_estimate_s"} <= seen  # parsed
    assert wrong == [], "config.yaml keys the docs name that shared/model_repository.py lacks"

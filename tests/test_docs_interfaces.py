"""The docs name only routes and commands that exist: README's API table lists exactly the
producer's documented routes, and every `conveyor …` command line of README.md and docs/ runs
a command the CLI has, with flags that command takes. Imports and parses only: no stack."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import click
from fastapi.routing import APIRoute
from starlette.routing import Route

from tests.conftest import REPO_ROOT

API_TABLE = re.compile(r"^## API\n.*?^\| route \| what \|\n\|---\|---\|\n(.*?)\n\n", re.M | re.S)
ROUTE_CODE = re.compile(r"(GET|POST|PUT|DELETE|HEAD|PATCH)(?: (/\S*))?")
DOCS = ("README.md", "docs/architecture.md", "docs/redis-cluster.md")


def _paths(written: str) -> Iterator[str]:
    """`/v1/batches[/{id}[/output\\|/errors]]` → each path it stands for, parameters as `{}`."""
    if optional := re.search(r"\[([^\[\]]*)\]", written):
        head, tail = written[: optional.start()], written[optional.end() :]
        yield from _paths(head + tail)
        for choice in optional.group(1).split("\\|"):
            yield from _paths(head + choice + tail)
    else:
        yield re.sub(r"\{\w+\}", "{}", written)


def documented_routes() -> set[tuple[str, str]]:
    """(method, path) of each row of README's API table: `GET /a`, or `POST`, `GET /a`."""
    table = API_TABLE.search((REPO_ROOT / "README.md").read_text())
    assert table is not None, "README lost its API table"
    routes = set()
    for row in table.group(1).splitlines():
        methods: list[str] = []
        for code in re.findall(r"`([^`]+)`", row.split(" | ")[0]):
            written = ROUTE_CODE.fullmatch(code)
            assert written is not None, f"not a route: {code}"
            methods.append(written.group(1))
            if written.group(2):
                routes |= {(m, p) for m in methods for p in _paths(written.group(2))}
                methods = []
    return routes


def served_routes() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(the routes the OpenAPI schema lists, every route the app answers)."""
    from producer_api.app import create_app
    from shared.settings import Settings

    listed, every = set(), set()
    for route in create_app(Settings()).routes:
        if not isinstance(route, Route):
            continue
        path = re.sub(r"\{\w+\}", "{}", route.path)
        pairs = {(method, path) for method in route.methods or ()}
        every |= pairs
        if isinstance(route, APIRoute) and route.include_in_schema:
            listed |= pairs
    return listed, every


def test_readme_api_table_lists_the_routes_the_app_serves() -> None:
    documented = documented_routes()
    assert ("GET", "/v1/batches/{}/errors") in documented  # brackets expanded
    assert ("DELETE", "/v1/models/{}/canary") in documented  # a row of several methods
    listed, every = served_routes()
    assert sorted(listed - documented) == [], "routes missing from README's API table"
    assert sorted(documented - every) == [], "README's API table names routes the app lacks"


def _commands(group: click.Group) -> dict[str, click.Command]:
    """Every command by its words after `conveyor` (`keys create`)."""
    context = click.Context(group)
    found: dict[str, click.Command] = {}
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert command is not None
        found[name] = command
        if isinstance(command, click.Group):
            found |= {f"{name} {sub}": c for sub, c in _commands(command).items()}
    return found


def doc_command_lines() -> Iterator[tuple[str, str]]:
    """(doc, a `conveyor …` command as written) from code blocks and inline code, each cut at
    its comment or at the next command of the line (`… / conveyor jobs cancel`)."""
    for doc in DOCS:
        text = (REPO_ROOT / doc).read_text()
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        for code in [line for block in blocks for line in block.splitlines()] + inline:
            for start in re.finditer(r"(?<!-n )\bconveyor (?=[a-z])", code):
                yield doc, re.split(r"\s#|\s/\s|;|\s\|\s|`", code[start.end() :])[0]


def test_docs_conveyor_commands_exist_with_their_flags() -> None:
    from conveyor.cli import main

    commands = _commands(main)
    lines = list(doc_command_lines())
    assert ("README.md", "keys webhook-secret --tenant acme") in lines  # parsed
    wrong = []
    for doc, line in lines:
        head, *rest = line.split(maxsplit=2)
        for sub in rest[0].split("|") if rest else [""]:  # `dlq replay|purge`: each of them
            name = next((n for n in (f"{head} {sub}", head) if n in commands), "")
            if not name:
                wrong.append(f"{doc}: conveyor {line}: no such command")
                continue
            params = commands[name].params
            flags = {flag for p in params for flag in [*p.opts, *p.secondary_opts]}
            wrong += [
                f"{doc}: conveyor {line}: {flag}"
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line)
                if flag not in flags
            ]
    assert wrong == [], "commands or flags the docs name that the CLI lacks"


def _readme() -> str:
    return (REPO_ROOT / "README.md").read_text()


def _row(head: str) -> str:
    """README's table row whose first cell is `head` (a route as its table writes it)."""
    rows = re.findall(rf"^\| `{re.escape(head)}` \|.*$", _readme(), re.M)
    assert len(rows) == 1, f"README has {len(rows)} rows for {head}"
    return rows[0]


def test_readme_rows_name_every_field_of_their_bodies() -> None:
    """A field a response carries, or a request takes, and its route's row never names is one
    no reader finds (`GET /v1/models` lacked `default_variant` and `oldest_queued_age_s`)."""
    from producer_api.batch_api.protocol import BatchView
    from producer_api.jobs.protocol import JobAccepted, JobRequest, JobView
    from producer_api.models.protocol import ModelCard, PartitionStats
    from shared.job_parameters import SamplingParameters

    openai_own = {"id", "object", "owned_by"}  # "OpenAI-style list" names them
    bodies: dict[str, list[Iterable[str]]] = {
        "POST /v1/jobs": [JobRequest.model_fields, JobAccepted.model_fields],
        "GET /v1/jobs/{id}": [JobView.model_fields],
        "GET /v1/models": [ModelCard.model_fields.keys() - openai_own, PartitionStats.model_fields],
        "GET /v1/batches/{id}": [BatchView.model_fields],
    }
    missing = [
        f"{route}: {name}"
        for route, models in bodies.items()
        for fields in models
        for name in fields
        if not re.search(rf"\b{name}\b", _row(route))
    ]
    sampling = re.search(r"^\| parameter \| takes \| unset \|\n(.*?)\n\n", _readme(), re.M | re.S)
    assert sampling is not None, "README lost its Sampling parameters table"
    documented = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)?", sampling.group(1), re.M))
    names = {name for pair in documented for name in pair if name}
    missing += [f"sampling: {name}" for name in SamplingParameters.model_fields.keys() - names]
    assert missing == [], "fields README's tables never name"


PACKAGES = ("shared", "producer_api", "workers", "conveyor", "autoscaling", "benchmarks")
FILE_PATH = re.compile(r"(?<![\w./{}<$-])((?:[\w.-]+/)+[\w.-]*\.(?:py|md|sh|ya?ml|json|toml))\b")
SYMBOL = re.compile(rf"`((?:{'|'.join(PACKAGES)})(?:/\w+)+)\.(?!(?:py|md|sh)`)(\w+)`")


def _missing_files(text: str, doc_folder: Path) -> Iterator[str]:
    """Paths (`producer_api/token_hub.py`, or a folder inside a package the text names:
    `jobs/protocol.py`) and bare file names (`stream_reader.py`) that no such file answers."""
    folders = [REPO_ROOT, doc_folder, *(REPO_ROOT / p for p in PACKAGES)]
    folders += [sub for folder in folders[2:] for sub in folder.iterdir() if sub.is_dir()]
    for path in set(FILE_PATH.findall(text)):
        if not path.startswith("var/") and not any((f / path).exists() for f in folders):
            yield path  # var/: what a run writes
    for name in set(re.findall(r"`(\w+\.py)`", text)):
        if not any(next((REPO_ROOT / p).rglob(name), None) for p in (*PACKAGES, "tests")):
            yield name


def _missing_names(text: str) -> Iterator[str]:
    """`module/path.function` and `Class.method` that their module or class lacks."""
    for module, name in set(SYMBOL.findall(text)):
        source = REPO_ROOT / f"{module}.py"
        if not source.exists() or not re.search(
            rf"^(?:async def |def |class )?{name}\b", source.read_text(), re.M
        ):
            yield f"{module}.{name}"
    sources = [path.read_text() for p in PACKAGES for path in (REPO_ROOT / p).rglob("*.py")]
    for owner, name in set(re.findall(r"`([A-Z][A-Za-z0-9]+)\.(_?[a-z]\w*)(?:\(\))?`", text)):
        homes = [s for s in sources if re.search(rf"^class {owner}\b", s, re.M)]
        if not any(re.search(rf"def {name}\b|^\s+{name}\s*[:=]", s, re.M) for s in homes):
            yield f"{owner}.{name}"


def test_docs_name_files_and_functions_that_exist() -> None:
    """A file, function or method the docs point a reader to that a rename left behind."""
    wrong = []
    for doc in DOCS:
        text = re.sub(r"`\w+\.md`", "", (REPO_ROOT / doc).read_text())  # `REPORT.md`: a file
        wrong += [f"{doc}: {miss}" for miss in _missing_files(text, (REPO_ROOT / doc).parent)]
        wrong += [f"{doc}: {miss}" for miss in _missing_names(text)]
    assert wrong == [], "paths or functions the docs name that the repository lacks"

"""`conveyor` starts without the imports of commands it does not run: `conveyor --help` listed
its commands by importing every one (Redis, numpy, the model repository, pydantic-settings),
most of a second of CPU before any command, which scripts and the test suite paid per call."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from conveyor import commands
from conveyor.cli import SUMMARIES, main
from conveyor.local_stack import StackState

# What a command that needs none of them must not import.
HEAVY = ("numpy", "redis", "shared.model_repository", "shared.settings", "pydantic_settings")
# What a command that only calls the producer (the SDK's) needs none of; it reads its settings.
NOT_FOR_THE_SDK = HEAVY[:3]
# What no command's help or usage error imports (click answers both before the command runs):
# the SDK's and the runtime's imports, tens to hundreds of ms each, most of a second together.
NOT_FOR_HELP = (*HEAVY, "httpx", "pydantic", "prometheus_client", "rich.console", "orjson")
NOT_FOR_HELP += ("conveyor.stack",)

_LOADED_AFTER = """
import json, sys
from conveyor.cli import main
try:
    main({argv!r})
except SystemExit as exit:
    code = exit.code
{then}
print(json.dumps({{"code": code, "loaded": sorted(set({watched!r}) & set(sys.modules))}}))
"""


def _loaded_after(
    argv: list[str], then: str = "", env: dict[str, str] | None = None
) -> tuple[int, str, list[str]]:
    """Run `conveyor argv` (and the code `then`) in a fresh interpreter: its exit status, what
    it printed, and which of NOT_FOR_HELP (or of the command modules) it imported."""
    watched = [*NOT_FOR_HELP, *(f"conveyor.commands.{name}" for name in SUMMARIES)]
    script = _LOADED_AFTER.format(argv=argv, then=then, watched=watched)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    printed, _, last = run.stdout.rstrip("\n").rpartition("\n")
    result = json.loads(last)
    return result["code"], printed + run.stderr, result["loaded"]


@pytest.mark.parametrize(("argv", "code"), [(["--help"], 0), ([], 2)], ids=["help", "bare"])
def test_listing_the_commands_imports_none_of_them(argv: list[str], code: int) -> None:
    """Bare `conveyor` prints the same listing (to standard error, exit 2, as click does)."""
    status, printed, heavy = _loaded_after(argv)
    assert status == code
    assert "Commands:" in printed and "submit" in printed
    assert heavy == [], f"`conveyor {' '.join(argv)}` imported {heavy}"


def test_a_summary_for_every_command_module_and_none_else() -> None:
    modules = {module.name for module in pkgutil.iter_modules(commands.__path__)}
    assert set(SUMMARIES) == modules


@pytest.mark.parametrize("name", sorted(SUMMARIES))
def test_each_summary_is_its_commands_first_sentence(name: str) -> None:
    command = main.get_command(click.Context(main), name)
    assert command is not None and command.help is not None
    assert SUMMARIES[name] == command.get_short_help_str(10_000)


@pytest.mark.parametrize("width", [30, 60, 80, 120, 250])
def test_listing_is_clicks_own_at_any_width(width: int) -> None:
    """The listing from SUMMARIES is what click prints from the imported commands."""
    listings = []
    for format_commands in (main.format_commands, click.Group.format_commands.__get__(main)):
        formatter = click.HelpFormatter(width=width)
        format_commands(click.Context(main), formatter)
        listings.append(formatter.getvalue())
    assert listings[0] == listings[1]
    assert "submit" in listings[0]


# Each command's help and usage errors, those with options checked against a store's limits
# among them (an upload's `--expires-after`, a canary's `--min-requests`): importing the limits
# from the store (Redis, the job store, the model repository) cost each command up to 0.6 s, and
# every command's top-level imports (the SDK, the stack, the settings) most of a second more;
# `keys create`'s `--scope` choices and `render keda`'s `--prometheus-url` default came from the
# modules that use them (Redis and the settings; the model repository).
HELP_CASES = [(name,) for name in sorted(SUMMARIES)]
HELP_CASES += [("jobs", "get"), ("files", "upload"), ("batch", "submit"), ("dlq", "replay")]
HELP_CASES += [("routes", "set"), ("canary", "start"), ("keys", "create"), ("render", "keda")]


@pytest.mark.parametrize("argv", HELP_CASES, ids=" ".join)
@pytest.mark.parametrize(("option", "code"), [("--help", 0), ("--no-such-option", 2)])
def test_help_and_usage_errors_import_nothing_heavy(
    argv: tuple[str, ...], option: str, code: int
) -> None:
    status, printed, loaded = _loaded_after([*argv, option])
    assert status == code, printed
    assert f"conveyor.commands.{argv[0]}" in loaded
    assert not set(NOT_FOR_HELP) & set(loaded), f"`conveyor {' '.join(argv)} {option}`: {loaded}"


def test_running_a_command_still_loads_what_it_needs() -> None:
    """What the cases above see is what a command imports: `models list` reads the model
    repository when it runs."""
    _, _, loaded = _loaded_after(["models", "list"])
    assert "shared.model_repository" in loaded


def test_finding_the_local_stack_imports_no_redis(tmp_path: Path) -> None:
    """`conveyor jobs get X` without --url reads the running `conveyor up`'s stack.json (here
    one naming this test's process) and the settings (their defaults: checking the default
    Redis URL imported redis), neither of which needs a Redis client."""
    state = StackState("redis://127.0.0.1:1/0", "http://127.0.0.1:1", "", os.getpid())
    state.write(tmp_path)
    then = """
from conveyor.client.cli_options import stack_target
assert stack_target(None, None) == ("http://127.0.0.1:1", None)
"""
    env = {name: value for name, value in os.environ.items() if not name.startswith("CONVEYOR_")}
    env["CONVEYOR_STATE_DIR"] = str(tmp_path)
    status, _, loaded = _loaded_after(["jobs", "get", "--help"], then, env)
    assert status == 0
    assert not set(NOT_FOR_THE_SDK) & set(loaded), f"finding the stack imported {loaded}"

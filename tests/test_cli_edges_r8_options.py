"""The traffic commands refuse an option they cannot send before any call, naming the option:
`routes set --weight a=nan` first read the routes, so with the producer down it exited 1
("cannot reach the producer") for what is a usage error, and a canary's bad `--interval` said
"Invalid value:" without saying which option. And every option of the operator commands has
its help text."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner

from conveyor.cli import main

NOWHERE = ("--url", "http://127.0.0.1:9")  # nothing listens: a call made fails as an outage
OPERATOR_COMMANDS = ("jobs", "models", "routes", "canary", "autoscale", "render", "dlq")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--weight", "default=nan"),
        ("--weight", "default=inf"),
        ("--weight", "default=1e400"),
        ("--shadow", "canary=nan"),
    ],
)
def test_a_route_number_that_is_not_finite_is_refused_before_any_call(
    option: str, value: str
) -> None:
    result = CliRunner().invoke(main, ["routes", "set", "identity", option, value, *NOWHERE])

    assert result.exit_code == 2, result.output
    assert f"Invalid value for {option}: '{value}'" in result.output
    assert "every number must be finite" in result.output
    assert "cannot reach" not in result.output


@pytest.mark.parametrize(
    ("option", "value"),
    [("--interval", "nan"), ("--max-step", "5 minutes"), ("--steps", "5,half")],
)
def test_a_canary_option_that_does_not_parse_is_named(option: str, value: str) -> None:
    result = CliRunner().invoke(
        main, ["canary", "start", "identity", "canary", option, value, *NOWHERE]
    )

    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': '{value}'" in result.output


def _commands() -> list[tuple[str, click.Command]]:
    found = []
    for name in OPERATOR_COMMANDS:
        command = importlib.import_module(f"conveyor.commands.{name}").command
        if isinstance(command, click.Group):
            found += [(f"{name} {sub}", each) for sub, each in command.commands.items()]
        else:
            found.append((name, command))
    return found


def test_every_option_of_the_operator_commands_has_help() -> None:
    bare = [
        f"{path} {'/'.join(param.opts)}"
        for path, command in _commands()
        for param in command.params
        if isinstance(param, click.Option) and not param.help
    ]
    assert bare == []


@pytest.mark.parametrize(
    ("option", "value"),
    [("--max-error-rate", "1.5"), ("--max-error-rate", "-0.1"), ("--max-p99-ms", "0")],
)
def test_a_canary_bound_the_producer_refuses_is_a_usage_error(option: str, value: str) -> None:
    result = CliRunner().invoke(
        main, ["canary", "start", "identity", "canary", option, value, *NOWHERE]
    )

    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output


def test_canary_start_help_states_its_bounds() -> None:
    """An unbounded FiniteFloat's help read `[default: 0.01; x<=None]`."""
    result = CliRunner().invoke(main, ["canary", "start", "--help"], terminal_width=200)

    assert result.exit_code == 0, result.output
    assert "None" not in result.output
    assert "[default: 0.01; 0<=x<=1]" in result.output
    assert "[default: 500.0; x>0]" in result.output

"""`conveyor routes set` refuses a weight or shadow rate the producer cannot take before any
call, naming the option: a negative weight or a rate above 1 first read the routes, so with
the producer down the usage error read as an outage ("cannot reach the producer", exit 1)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conveyor.cli import main

NOWHERE = ("--url", "http://127.0.0.1:9")  # nothing listens: a call made fails as an outage


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--weight", "default=-5"),
        ("--weight", "default=150"),
        ("--shadow", "canary=-0.5"),
        ("--shadow", "canary=1.5"),
    ],
)
def test_a_route_number_out_of_range_is_refused_before_any_call(option: str, value: str) -> None:
    result = CliRunner().invoke(main, ["routes", "set", "identity", option, value, *NOWHERE])

    assert result.exit_code == 2, result.output
    assert f"Invalid value for {option}: '{value}'" in result.output
    assert "cannot reach" not in result.output

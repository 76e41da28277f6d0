"""`conveyor canary start --steps` refuses percents the producer cannot take before any call,
naming the option: `nan` was caught only as the body was written ("every number must be
finite", no option named), and `-5`, `0`, `150`, `50,25` or nothing at all went to the
producer, so with it down the usage error read as an outage (exit 1)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conveyor.cli import main

NOWHERE = ("--url", "http://127.0.0.1:9")  # nothing listens: a call made fails as an outage


@pytest.mark.parametrize("value", ["nan,100", "5,inf", "-5,100", "0,100", "50,150", "50,25", ","])
def test_steps_the_producer_refuses_are_a_usage_error_naming_the_option(value: str) -> None:
    result = CliRunner().invoke(
        main, ["canary", "start", "identity", "canary", "--steps", value, *NOWHERE]
    )

    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--steps': '{value}'" in result.output
    assert "cannot reach" not in result.output

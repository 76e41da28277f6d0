"""An option value the producer can only refuse is a usage error (exit 2) naming the option,
before any call: it was the producer's 422 (exit 1), naming a query field the user never typed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conveyor.cli import main

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a call would fail with exit 1


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("routes", "show", "m", "--history", "-1"), "'--history'"),
        (("routes", "show", "m", "--history", "1001"), "'--history'"),
        (("canary", "start", "m", "v", "--min-requests", "0"), "'--min-requests'"),
    ],
)
def test_an_option_out_of_the_producer_s_range_is_a_usage_error(
    args: tuple[str, ...], option: str
) -> None:
    result = CliRunner().invoke(main, [*args, "--url", NOWHERE])

    assert result.exit_code == 2, result.output
    assert f"Invalid value for {option}" in result.output

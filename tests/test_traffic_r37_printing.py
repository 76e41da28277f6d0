"""Traffic percents as `conveyor routes` and `conveyor canary` print them, against a real producer:
`routes` printed weights with two decimals, so a 0.001 % canary read 0.00 % beside a baseline of
100.00 %, and `canary` with `:g`'s six digits, so a 99.99999 % step read 100. Each now shows the
decimals a percent needs (up to the routes' 6)."""

from __future__ import annotations

from click.testing import CliRunner

from conveyor.cli import main
from tests.test_traffic_r37_routes_cli import producer  # noqa: F401 (a fixture)


def test_routes_show_a_tiny_weight_as_itself(producer: str) -> None:  # noqa: F811
    result = CliRunner().invoke(
        main,
        [
            *("routes", "set", "ab", "--no-shadows", "--url", producer),
            *("--weight", "stable=99.999", "--weight", "candidate=0.001"),
        ],
    )

    assert result.exit_code == 0, result.output
    assert "  stable               99.999 %\n" in result.output, result.output
    assert "  candidate             0.001 %\n" in result.output, result.output
    assert "stable 99.999, candidate 0.001;" in result.output, result.output

    shown = CliRunner().invoke(main, ["routes", "show", "ab", "--url", producer])
    assert "  candidate             0.001 %\n" in shown.output, shown.output


def test_a_canary_step_near_100_is_not_shown_as_100(producer: str) -> None:  # noqa: F811
    runner = CliRunner()
    routes = ["routes", "set", "ab", "--weight", "stable=100", "--no-shadows", "--url", producer]
    assert runner.invoke(main, routes).exit_code == 0
    start = ["canary", "start", "ab", "candidate", "--steps", "99.99999,100", "--url", producer]

    started = runner.invoke(main, start)
    aborted = runner.invoke(main, ["canary", "abort", "ab", "--url", producer])

    assert started.exit_code == 0, started.output
    assert "(steps 99.99999,100)" in started.output, started.output
    assert aborted.exit_code == 0, aborted.output

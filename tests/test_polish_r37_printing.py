"""Rates as `conveyor canary status` and `conveyor routes` print them: a decision's error rate
printed with `.2%`, so 0.0025 % of errors read 0.00 %, and a history line's shadow rate with
`:g`, so 0.9999995 read 1. Each now shows the decimals it needs, as the traffic percents."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.commands.canary import print_canary
from tests.test_traffic_r37_routes_cli import producer  # noqa: F401 (a fixture)


def test_a_tiny_error_rate_is_not_shown_as_none(capsys: pytest.CaptureFixture[str]) -> None:
    canary = {"model": "ab", "variant": "candidate", "baseline": "stable", "state": "running"}
    canary |= {"weight": 5.0, "steps": [5.0, 100.0], "started_at": 100.0}
    numbers = {  # as the controller's `numbers` answers them: rates to 6 digits
        "canary": {"requests": 40000, "error_rate": 0.000025, "p99_ms": 7.0},
        "baseline": {"requests": 90000, "error_rate": 0.2353, "p99_ms": 8.0},
    }
    event = {"at": 160.0, "type": "hold", "weight": 5.0, "reason": "bounds held"}

    print_canary({"canary": canary, "events": [event | {"numbers": numbers}]}, 5)

    decision = capsys.readouterr().out.splitlines()[-1]
    canary_side = "canary 40000 req, 0.0025% errors, p99 7.0 ms"
    assert decision.endswith(f"{canary_side}  baseline 90000 req, 23.53% errors, p99 8.0 ms"), (
        decision
    )


def test_a_history_shadow_rate_near_1_is_not_shown_as_1(producer: str) -> None:  # noqa: F811
    result = CliRunner().invoke(
        main,
        [
            *("routes", "set", "ab", "--weight", "stable=100", "--url", producer),
            *("--shadow", "mirror=0.9999995"),
        ],
    )

    assert result.exit_code == 0, result.output
    # the current shadow and the change's, alike
    assert "  mirror               shadow, 99.99995 % of online requests\n" in result.output
    assert "; shadows mirror 99.99995 %; sticky by" in result.output, result.output

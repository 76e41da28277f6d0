"""`conveyor canary status` printed a p99 nobody judged as `p99 None ms`: README's walkthrough
ends a healthy canary on a `completed` line whose baseline, short of `min_requests` at 100 %,
is counted over the whole canary from its counters alone, so it has no p99."""

from __future__ import annotations

import pytest

from conveyor.commands.canary import print_canary


def test_a_decision_without_a_p99_says_it_was_not_judged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    canary = {"model": "ab", "variant": "candidate", "baseline": "stable", "state": "completed"}
    canary |= {"weight": 100.0, "steps": [5.0, 100.0], "started_at": 100.0}
    numbers = {
        "canary": {"requests": 505, "error_rate": 0.0, "p99_ms": 7.0},
        "baseline": {"requests": 1684, "error_rate": 0.0, "p99_ms": None},
    }
    event = {"at": 160.0, "type": "completed", "weight": 100.0, "reason": "bounds held"}

    print_canary({"canary": canary, "events": [event | {"numbers": numbers}]}, 5)

    decision = capsys.readouterr().out.splitlines()[-1]
    assert decision.endswith(
        "canary 505 req, 0.00% errors, p99 7.0 ms  baseline 1684 req, 0.00% errors, p99 not judged"
    ), decision

"""Stack-free: the lane credit arithmetic that decides when the bulk lane (Batch API jobs)
gets a micro-batch while online requests keep arriving."""

from __future__ import annotations

import pytest

from workers.partition.lane_scheduler import LaneCredit


def _serve(credit: LaneCredit, batches: int) -> list[str]:
    """Which lane each of `batches` micro-batches goes to when both lanes always have work."""
    served: list[str] = []
    for _ in range(batches):
        bulk = credit.bulk_turn()
        credit.served(bulk=bulk)
        served.append("bulk" if bulk else "online")
    return served


def test_bulk_gets_one_batch_after_every_five_online_at_a_fifth_share() -> None:
    served = _serve(LaneCredit(0.2), batches=12)
    assert served == ["online"] * 5 + ["bulk"] + ["online"] * 5 + ["bulk"]


def test_a_zero_share_never_gives_bulk_a_turn_while_online_has_work() -> None:
    assert _serve(LaneCredit(0.0), batches=50) == ["online"] * 50


def test_a_full_share_alternates_the_lanes() -> None:
    assert _serve(LaneCredit(1.0), batches=6) == ["online", "bulk"] * 3


@pytest.mark.parametrize("share", [0.1, 0.25, 0.3, 0.5, 0.7, 0.9])
def test_bulk_gets_share_batches_per_online_batch(share: float) -> None:
    served = _serve(LaneCredit(share), batches=1000)
    assert served.count("bulk") == pytest.approx(served.count("online") * share, abs=2)


def test_credit_carries_the_rest_of_a_share_but_never_a_second_turn() -> None:
    credit = LaneCredit(0.7)
    credit.served(bulk=False)
    credit.served(bulk=False)  # 1.4: bulk's turn, 0.4 of the next one carried
    assert credit.bulk_turn() and credit.credit == pytest.approx(1.4)
    credit.served(bulk=True)
    assert not credit.bulk_turn() and credit.credit == pytest.approx(0.4)
    credit.served(bulk=False)
    credit.served(bulk=False)  # a turn due and not taken (bulk was empty) is forfeit, rest too
    assert credit.credit == 0.0


def test_an_empty_bulk_lane_on_its_turn_forfeits_the_credit() -> None:
    credit = LaneCredit(0.5)
    credit.served(bulk=False)
    credit.served(bulk=False)
    assert credit.bulk_turn()
    credit.served(bulk=False)  # bulk's turn, but the take found only online work
    assert credit.credit == 0.0 and not credit.bulk_turn()


def test_bulk_served_on_online_turn_leaves_the_credit() -> None:
    """Online was empty, so the take fell through to bulk: that costs bulk no credit."""
    credit = LaneCredit(0.5)
    credit.served(bulk=False)
    credit.served(bulk=True)
    assert credit.credit == 0.5

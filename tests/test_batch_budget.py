"""The micro-batch cap while tenants compete in a fair lane (`queue.fair_batch_ms`): additive
increase within the budget, multiplicative decrease over it, only while round robin serves more
than one tenant. The loop that applies it is tested end to end in test_tenant_fairness.py."""

from __future__ import annotations

from shared.codec import RequestEntry
from workers.batching.batch_budget import COMPETING_S, BatchBudget
from workers.partition.stream_reader import Delivery


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _read(tenant: str, moved: bool = True) -> Delivery:
    entry = RequestEntry(job_id=f"job-{tenant}", payload={}, enqueued_ms=0.0, tenant=tenant)
    return Delivery(b"1-0", entry, "queued", 0, moved=moved)


def _competing(clock: Clock, max_items: int = 8, budget_ms: float | None = 5.0) -> BatchBudget:
    budget = BatchBudget(max_items, budget_ms, clock)
    budget.read([_read("flood"), _read("quiet")])
    return budget


def test_calls_over_budget_shrink_the_cap_by_a_tenth_and_one_at_least() -> None:
    budget = _competing(Clock(), max_items=32)
    sizes = []
    for _ in range(6):
        size = budget.limit()
        sizes.append(size)
        budget.ran(size, 0.010)
    assert sizes == [32, 28, 25, 22, 19, 17]
    small = _competing(Clock(), max_items=4)
    for _ in range(5):
        small.ran(small.limit(), 0.010)
    assert small.limit() == 2  # 4, 3, 2: one job per competing tenant at least


def test_each_competing_tenant_keeps_a_place_in_every_micro_batch() -> None:
    budget = _competing(Clock(), max_items=4)
    budget.read([_read("third")])
    for _ in range(5):
        budget.ran(budget.limit(), 0.010)
    assert budget.limit() == 3
    crowd = _competing(Clock(), max_items=4)
    crowd.read([_read(f"tenant-{n}") for n in range(6)])
    crowd.ran(4, 0.010)
    assert crowd.limit() == 4  # more tenants than a micro-batch holds: never past its size


def test_full_calls_within_budget_grow_the_cap_back_one_at_a_time() -> None:
    budget = _competing(Clock())
    budget.ran(8, 0.010)
    budget.ran(7, 0.010)
    assert budget.limit() == 6
    budget.ran(3, 0.001)  # a call the stream could not fill says nothing of a bigger one
    assert budget.limit() == 6
    budget.ran(6, 0.001)
    budget.ran(7, 0.001)
    budget.ran(8, 0.001)
    assert budget.limit() == 8  # never past max_batch_size


def test_a_tenant_alone_keeps_full_micro_batches() -> None:
    budget = BatchBudget(8, 5.0, Clock())
    budget.read([_read("flood"), _read("flood")])
    budget.ran(8, 0.050)
    assert not budget.competing()
    assert budget.limit() == 8


def test_jobs_added_straight_to_the_stream_are_no_competition() -> None:
    """Only jobs round robin moved in say jobs are held: a lane keeping up needs no cap."""
    budget = BatchBudget(8, 5.0, Clock())
    budget.read([_read("flood", moved=False), _read("quiet", moved=False)])
    budget.ran(8, 0.050)
    assert budget.limit() == 8


def test_competition_ends_a_second_after_the_other_tenant_was_last_served() -> None:
    clock = Clock()
    budget = _competing(clock)
    budget.ran(8, 0.050)
    assert budget.limit() == 7
    clock.now += COMPETING_S / 2
    budget.read([_read("flood")])
    assert budget.limit() == 7  # the quiet tenant still counts
    clock.now += COMPETING_S
    assert budget.limit() == 8  # it sent nothing for a second: full micro-batches again
    budget.ran(8, 0.050)  # and calls over the budget no longer shrink the cap
    budget.read([_read("quiet")])
    assert budget.limit() == 7


def test_no_budget_never_caps() -> None:
    budget = _competing(Clock(), budget_ms=None)
    budget.ran(8, 1.0)
    assert not budget.competing()
    assert budget.limit() == 8

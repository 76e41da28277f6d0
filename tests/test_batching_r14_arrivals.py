"""Stack-free: the arrival-rate estimate that decides whether a micro-batch is held open for more
jobs forgets what held micro-batches gained once the traffic stops, as it forgets the rate."""

from __future__ import annotations

from workers.partition.arrival_rate import ArrivalRate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_what_waits_gained_fades_with_the_traffic() -> None:
    """Steady traffic whose held micro-batches gained what its rate promised: once it stopped,
    both counts of the waits decayed alike, so their rate did not; seconds later, with the
    overall rate down to a few dozen jobs a second, a lone job still waited for 800 a second."""
    clock = Clock()
    rate = ArrivalRate(clock=clock)
    for n in range(3_000):  # 1000 jobs a second, each micro-batch of two held open 2 ms
        clock.now += 0.001
        rate.arrived(1)
        if n % 2:
            rate.waited(0.002, gained=2)
    assert rate.expects_more(0.002)
    clock.now += 5  # silence
    assert rate.overall() < 30
    assert rate.while_waiting() < 2 * rate.overall()
    assert not rate.expects_more(0.002)


def test_no_prior_divides_by_nothing() -> None:
    """Without a prior (`prior_s` 0), an estimate that has seen no wait is the rate itself."""
    clock = Clock()
    rate = ArrivalRate(prior_s=0.0, clock=clock)
    assert rate.while_waiting() == 0.0
    rate.arrived(10)
    assert rate.while_waiting() == rate.overall() > 0

"""Stack-free: the arrival-rate estimate that decides whether a partition holds a micro-batch
open for more jobs: an idle partition serves a lone job at once, a busy one waits, and a client
at concurrency 1 (nothing arrives while its job waits) stops being waited for."""

from __future__ import annotations

import pytest

from workers.partition.arrival_rate import ArrivalRate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _steady(rate: ArrivalRate, clock: Clock, per_s: float, seconds: float) -> None:
    """Jobs read one at a time at `per_s` for `seconds`."""
    for _ in range(int(per_s * seconds)):
        clock.now += 1 / per_s
        rate.arrived(1)


def test_an_idle_partition_expects_nothing() -> None:
    clock = Clock()
    rate = ArrivalRate(clock=clock)
    assert not rate.expects_more(0.005)
    rate.arrived(1)  # a lone job after a long silence
    assert not rate.expects_more(0.005)


def test_a_steady_rate_is_estimated_and_forgotten_once_it_stops() -> None:
    clock = Clock()
    rate = ArrivalRate(clock=clock)
    _steady(rate, clock, 1000, 5)
    assert rate.overall() == pytest.approx(1000, rel=0.05)
    assert rate.expects_more(0.005) and not rate.expects_more(0.0005)
    clock.now += 10
    assert rate.overall() < 1 and not rate.expects_more(0.005)


def test_waits_that_gain_nothing_stop_the_waiting_then_it_is_tried_again() -> None:
    """Concurrency 1: jobs come back to back at 1000/s, but never while one waits."""
    clock = Clock()
    rate = ArrivalRate(clock=clock)
    _steady(rate, clock, 1000, 3)
    assert rate.expects_more(0.005)
    waits = 0
    while rate.expects_more(0.005):
        rate.waited(0.005, gained=0)
        waits += 1
    assert waits <= 8  # a few fruitless waits, not one per job from now on
    assert rate.overall() * 0.005 > 4  # the overall rate alone no longer decides
    clock.now += 5  # a while without waiting: the evidence fades and a wait is tried again
    _steady(rate, clock, 1000, 0.5)
    assert rate.expects_more(0.005)


def test_what_waits_gained_is_the_rate_that_counts() -> None:
    clock = Clock()
    rate = ArrivalRate(clock=clock)
    _steady(rate, clock, 100, 3)  # overall 100/s: a 5 ms window expects half a job
    assert not rate.expects_more(0.005)
    for _ in range(20):
        rate.waited(0.005, gained=2)  # but a batch held open gains 400/s (bursts)
    assert rate.while_waiting() == pytest.approx(400, rel=0.15)
    assert rate.expects_more(0.005)

"""Stack-free: when a staged engine's batching loop reads its next micro-batch. Just before the
device is due to be free (a read and a host stage ahead of it), not as soon as the last one is
queued, so a job that arrives meanwhile is not left behind one more micro-batch."""

from __future__ import annotations

import asyncio

import pytest

from workers.batching.device_schedule import LEAD_FACTOR, LEAD_SLACK_S, DeviceSchedule


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _learned(clock: Clock, run_s: float, lead_s: float) -> DeviceSchedule:
    """A schedule that saw one micro-batch read and prepared in `lead_s`, then run in `run_s`."""
    schedule = DeviceSchedule(clock)
    await schedule.until_wanted()  # nothing on the device: at once
    clock.now += lead_s
    schedule.given()
    clock.now += run_s
    schedule.done(run_s)
    return schedule


async def test_an_idle_device_wants_its_next_micro_batch_at_once() -> None:
    schedule = await _learned(Clock(), run_s=10.0, lead_s=0.004)
    await asyncio.wait_for(schedule.until_wanted(), timeout=1)


async def test_the_next_read_waits_for_the_device_and_wakes_when_it_frees() -> None:
    clock = Clock()
    schedule = await _learned(clock, run_s=10.0, lead_s=0.004)
    assert schedule.lead_s == pytest.approx(0.2 * 0.004)
    await schedule.until_wanted()
    clock.now += 0.004
    schedule.given()  # on the device for 10 s, by the average
    assert schedule.busy_until == pytest.approx(clock.now + 10.0)
    reading = asyncio.create_task(schedule.until_wanted())
    await asyncio.sleep(0.1)
    assert not reading.done()  # 10 s of run ahead: reading now would hold jobs back
    schedule.done(9.0)  # the device freed early
    await asyncio.wait_for(reading, timeout=1)


async def test_the_read_starts_a_lead_before_the_device_is_due() -> None:
    clock = Clock()
    schedule = await _learned(clock, run_s=10.0, lead_s=0.004)
    await schedule.until_wanted()
    schedule.given()
    clock.now = schedule.busy_until - (LEAD_FACTOR * schedule.lead_s + LEAD_SLACK_S)
    await asyncio.wait_for(schedule.until_wanted(), timeout=1)  # due within the lead: at once


async def test_a_read_that_blocked_on_an_empty_stream_counts_for_one_run_at_most() -> None:
    clock = Clock()
    schedule = await _learned(clock, run_s=0.02, lead_s=0.004)
    before = schedule.lead_s
    await schedule.until_wanted()
    clock.now += 30.0  # the stream was empty: the read blocked until a job came
    schedule.given()
    assert schedule.lead_s == pytest.approx(before + 0.2 * (0.02 - before))

"""Benchmark part G's thread spread (`benchmarks.process_cpu.ThreadMeter`) on this very process:
a thread kept busy shows up as its busiest, and idle ones do not count as busy."""

from __future__ import annotations

import os
import threading
import time

from benchmarks.process_cpu import ThreadMeter


def _spin(done: threading.Event) -> None:
    while not done.is_set():
        sum(range(1000))


def test_a_spinning_thread_is_the_busiest_and_idle_ones_are_not_busy() -> None:
    done = threading.Event()
    idle = [threading.Thread(target=done.wait) for _ in range(3)]
    spinner = threading.Thread(target=_spin, args=(done,))
    meter = ThreadMeter({"me": os.getpid()})
    try:
        for thread in idle:
            thread.start()
        meter.start()
        began = time.monotonic()
        spinner.start()
        time.sleep(0.5)
        spread = meter.stop(time.monotonic() - began)["me"]
    finally:
        done.set()
        for thread in [*idle, spinner]:
            thread.join()
    assert spread["threads"] >= 5  # this one, the spinner, the three waiting
    assert spread["busiest"][0] > 0.05, spread  # the spinner, however loaded the machine
    busy = spread["busy_threads"]
    assert busy >= 1 and busy <= spread["threads"] - 3, spread  # the waiting are idle

"""A window of many latency samples is decoded off the event loop: 100,000 took about 0.2 s
there, every request its producer served waiting (a canary's look reads one twice a second, an
experiment a 6 h one). A small window stays on the loop (a thread hop would cost it more).
The thread each decode ran on is recorded; on a real Valkey."""

from __future__ import annotations

import threading
import time

import pytest
import redis.asyncio as aioredis

from shared.keys import Keys
from shared.stats_window import BUCKET_S
from shared.variant_stats import DECODED_ON_THE_LOOP, Sample, VariantStats

KEYS = Keys("stats-r29-decode:")
FAST = Sample(True, 1.0, 5.0)


@pytest.fixture
def decoded_on(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names of the threads samples were decoded on."""
    threads: set[str] = set()
    decode = Sample.decode

    def recorded(text: str) -> Sample:
        threads.add(threading.current_thread().name)
        return decode(text)

    monkeypatch.setattr(Sample, "decode", staticmethod(recorded))
    return threads


@pytest.mark.parametrize(("samples", "on_the_loop"), [(10, True), (DECODED_ON_THE_LOOP, False)])
async def test_many_samples_are_decoded_off_the_event_loop(
    aredis: aioredis.Redis, decoded_on: set[str], samples: int, on_the_loop: bool
) -> None:
    stats = VariantStats(aredis, KEYS)
    variant = f"v{samples}"
    await stats.record_samples({("m", variant): [FAST] * samples})
    window = (await stats.window("m", [variant], time.time() - BUCKET_S))[variant]
    assert window.samples == [FAST] * samples
    assert (decoded_on == {threading.current_thread().name}) is on_the_loop, decoded_on

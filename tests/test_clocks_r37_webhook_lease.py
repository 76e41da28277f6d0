"""A reclaimer's lease on an overdue webhook event holds against a reader whose host clock is
ahead. Each lease's end was stamped by its holder's clock and judged by the next reader's: a
worker 30 s ahead of the holder read a 20 s lease (a 20 s visibility timeout) as lapsed at once,
took the event too, and both sent it. Leases are stamped and judged on Redis's clock. On a real
Valkey; the skewed host's clock is its `time.time_ns`, read before any skew is measured."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from shared.job_store import now_ms
from shared.keys import Keys
from shared.webhook_outbox import WebhookOutbox

KEYS = Keys("clk-lease:")
LANE = "lane-a"
IDLE_MS = 20_000  # the visibility timeout: how long a reader waits before an event is overdue
SKEW_NS = 30 * 1_000_000_000


async def test_a_lease_holds_against_a_reader_whose_clock_runs_ahead(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an event owed for a minute, as the script that ended its job scored it
    await aredis.zadd(KEYS.webhooks_owed(LANE), {"job-1": now_ms() - 60_000})
    holder, ahead = WebhookOutbox(aredis, KEYS), WebhookOutbox(aredis, KEYS)
    assert await holder.overdue(LANE, now_ms() - IDLE_MS, 10) == ["job-1"]

    real_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + SKEW_NS)  # uncorrected: no measure
    ahead_ms = now_ms()
    assert await ahead.overdue(LANE, ahead_ms - IDLE_MS, 10) == []  # the holder's lease holds
    assert await holder.overdue(LANE, ahead_ms - IDLE_MS, 10) == ["job-1"]  # its own, again

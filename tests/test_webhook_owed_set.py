"""`WebhookOutbox`, the one client-side owner of a lane's webhooks-owed set, on a real Valkey:
settling takes off only the jobs named, and what is overdue comes oldest first, bounded, as the
reclaimer's pass reads it (tests/test_webhook_outbox.py runs the writer, reclaimer and cancel
through it end to end)."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from shared.keys import Keys
from shared.webhook_outbox import WebhookOutbox

KEYS = Keys("owed-set:")
LANE, OTHER_LANE = "lane-a", "lane-b"


async def _owe(client: aioredis.Redis, stream: str, owed: dict[str, int]) -> None:
    """What the scripts that end jobs leave (shared/job_scripts.py, `owe`): id by end ms."""
    await client.zadd(KEYS.webhooks_owed(stream), owed)


async def _owed(client: aioredis.Redis, stream: str) -> list[str]:
    return [m.decode() for m in await client.zrange(KEYS.webhooks_owed(stream), 0, -1)]


async def test_settle_takes_off_only_the_jobs_named_in_their_lane(aredis: aioredis.Redis) -> None:
    await _owe(aredis, LANE, {"a": 1, "b": 2, "c": 3})
    await _owe(aredis, OTHER_LANE, {"a": 1})
    await WebhookOutbox(aredis, KEYS).settle(LANE, ["a", "c", "never-owed"])
    assert await _owed(aredis, LANE) == ["b"]
    assert await _owed(aredis, OTHER_LANE) == ["a"]


async def test_settling_nothing_sends_no_command(aredis: aioredis.Redis) -> None:
    await _owe(aredis, LANE, {"a": 1})
    await aredis.config_resetstat()
    await WebhookOutbox(aredis, KEYS).settle(LANE, [])
    stats: dict[str, Any] = await aredis.info("commandstats")
    assert "cmdstat_zrem" not in stats
    assert await _owed(aredis, LANE) == ["a"]


async def test_overdue_is_what_ended_by_the_cutoff_oldest_first_and_bounded(
    aredis: aioredis.Redis,
) -> None:
    await _owe(aredis, LANE, {"late": 5_000, "third": 3_000, "first": 1_000, "second": 2_000})
    await _owe(aredis, OTHER_LANE, {"elsewhere": 500})
    outbox = WebhookOutbox(aredis, KEYS)
    assert await outbox.overdue(LANE, 3_000, 10) == ["first", "second", "third"]  # inclusive
    assert await outbox.overdue(LANE, 2_999, 10) == ["first", "second"]
    assert await outbox.overdue(LANE, 10_000, 2) == ["first", "second"]
    assert await outbox.overdue(LANE, 999, 10) == []
    assert await outbox.overdue("no-such-lane", 10_000, 10) == []
    assert len(await _owed(aredis, LANE)) == 4  # reading settles nothing

"""A replay onto an empty lane of a stalled partition (its worker beats, nothing finishes): a
submit there is refused before ENQUEUE when the stall alone makes it late
(`QueueEta.stalled_ahead`), but a replay got only the admission's `max_ahead`, 0, which ENQUEUE
admits with nothing ahead: the letter was enqueued past its deadline, to expire unrun. On a real
Valkey, the stall set as in test_queue_eta_r19_stalled_empty_lane.py (an online backlog, the
bulk lane empty)."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.dead_letters import DEADLINE_UNMEETABLE, DeadLetters, KeptLetter
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from tests.test_dead_letter_replays import VARIANT, _dead_letter
from tests.test_queue_eta_deadlines import _queue_eta
from tests.test_queue_eta_r19_stalled_empty_lane import _stalled

KEYS = Keys()
BULK = KEYS.bulk_queue("steady", VARIANT)


async def test_a_letter_the_stall_alone_makes_late_is_kept_off_an_empty_lane(
    aredis: aioredis.Redis,
) -> None:
    await _stalled(aredis)
    eta = _queue_eta(aredis)
    await eta.refresh()
    partition = (KEYS, "steady")
    soon = await _dead_letter(aredis, "soon", BULK, now_ms() + 1_000, partition=partition)
    # no deadline of its own: `steady`'s max_queue_time_s (600 s) outlasts the stall
    undated = await _dead_letter(aredis, "undated", BULK, partition=partition)
    admission = eta.admission(eta.repository.models["steady"], VARIANT)
    letters = DeadLetters(JobStore(aredis, KEYS, 60), KEYS, "steady", VARIANT, admission=admission)
    (first, _) = await letters.entries()
    result = await letters.replay()
    assert result.kept == [KeptLetter(first.dlq_id, soon, DEADLINE_UNMEETABLE)]  # was replayed
    assert [old for old, _ in result.replayed] == [undated]
    assert await aredis.xlen(BULK) == 1

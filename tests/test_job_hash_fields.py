"""A job's hash names its `deadline` only when the job has one, as its stream entry does
(`tests/test_valkey_cost_enqueue.py`): a `deadline: 0` cost Valkey a field per job without one
(ENQUEUE's arguments, the hash's memory, the append-only file). Written so by every job writer:
a submit (tests/test_queue_eta_deadlines.py), a shadow copy, a dead letter's replay. Every
release's readers of the hash (the in-flight prune, a Batch API item's state) read a missing one
as none."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from producer_api.routes.shadowing import ShadowCopies
from shared.codec import RequestEntry
from shared.dead_letters import DeadLetters
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from shared.shadow_pairs import ShadowPairs
from tests.test_dead_letter_replays import KEYS as DLQ_KEYS
from tests.test_dead_letter_replays import _dead_letter
from tests.test_shadow_copies import CONFIG, ROUTES


async def test_a_replay_of_a_job_without_a_deadline_names_none(aredis: aioredis.Redis) -> None:
    old = await _dead_letter(aredis, "t")
    store = JobStore(aredis, DLQ_KEYS, 60)
    ((replayed, new),) = (await DeadLetters(store, DLQ_KEYS, "m", "default").replay()).replayed
    job = await aredis.hgetall(DLQ_KEYS.job(new))
    assert (replayed, job[b"replay_of"]) == (old, old.encode()), job
    assert b"deadline" not in job, job


@pytest.mark.parametrize("deadline", [0, 60_000])
async def test_a_shadow_copy_names_its_primarys_deadline_only_if_set(
    aredis: aioredis.Redis, deadline: int
) -> None:
    keys = Keys("job-hash-shadow:")
    store = JobStore(aredis, keys, ttl_s=60)
    copies = ShadowCopies(store, ShadowPairs(aredis, keys, ttl_s=60), keys)
    deadline_ms = now_ms() + deadline if deadline else 0
    primary = RequestEntry(new_job_id("m", "stable"), {"inputs": {}}, now_ms(), deadline_ms)
    copies.copy(CONFIG, ROUTES, primary, "stable")
    await copies.stop()  # the copy is made in the background
    ((_, fields),) = await aredis.xrange(keys.bulk_queue("m", "mirror"))
    job = await aredis.hgetall(keys.job(RequestEntry.decode(fields).job_id))
    assert job[b"shadow_of"] == primary.job_id.encode(), job
    assert job.get(b"deadline") == (str(deadline_ms).encode() if deadline else None), job

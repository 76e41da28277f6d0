"""A cancel whose TRANSITION reply was lost after the server ran it (through a real proxy to a real
Valkey), so the client sent it again: the first run withdrew the queued job's stream entry, and
the rerun, finding the job cancelled already, said nothing of it, so the end no worker will read
went uncounted (`conveyor_jobs_finished_total{state="cancelled"}`). The rerun finds its own
`ended_by` token now and says what its first run withdrew; another cancel's counts nothing."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import RequestEntry
from shared.job_states import IllegalTransition, JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.metrics import JOBS_FINISHED
from tests.test_resends_r37_reruns import reply_lost


async def test_a_cancel_sent_again_counts_the_entry_it_withdrew_once(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    keys = Keys(f"r38-rerun-{uuid.uuid4().hex[:8]}:")
    stream = keys.queue("m", "default")
    await aredis.xgroup_create(stream, GROUP, "0", mkstream=True)
    entry = RequestEntry("a", {"inputs": {}}, now_ms())
    await JobStore(aredis, keys, 60).create(entry, stream, {"model": "m", "variant": "default"}, 5)
    ended = JOBS_FINISHED.labels("m", "default", "cancelled")
    counted = ended._value.get()
    async with reply_lost(redis_url, aredis, job_scripts.TRANSITION) as client:
        record = await JobStore(client, keys, 60).transition("a", JobStatus.CANCELLED)
    assert record.status == JobStatus.CANCELLED
    assert await aredis.xlen(stream) == 0  # withdrawn by the first run
    assert ended._value.get() == counted + 1
    with pytest.raises(IllegalTransition):  # another cancel: no rerun of this one's move
        await JobStore(aredis, keys, 60).transition("a", JobStatus.CANCELLED)
    assert ended._value.get() == counted + 1

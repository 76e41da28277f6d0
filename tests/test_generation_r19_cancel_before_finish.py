"""A cancel (DELETE /v1/jobs/{id}) that lands between a generate tick's status read-back and its
FINISH, on a real Valkey with the paced test engine and no worker process. The cancel won (the
record `cancelled`), but FINISH refused the `succeeded` result, so the job counted in no
finished state and got no final of its own. It now counts once, as `cancelled`, and its final
says so; a job that ended normally costs no read more than before."""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from shared.job_states import JobStatus
from shared.job_store import JobStore
from shared.token_stream import usage_of
from tests.test_generate_r17_cancel_after_final import (
    KEYS,
    CancelBeforeFinish,
    _loop,
    _record,
    _run,
)
from tests.test_tokens_r14_cancel_at_end import _finished
from workers.generation.generate_loop import GenerateLoop
from workers.partition.token_writer import TickWritten, TokenAppend, TokenWriter


class ReadsAfterTheEnd(TokenWriter):
    """The token writer, noting each status it reads of a job the loop no longer runs."""

    loop: GenerateLoop
    late_reads: list[str]

    async def write(self, appends: Sequence[TokenAppend], watch: Sequence[str]) -> TickWritten:
        self.late_reads += [job_id for job_id in watch if job_id not in self.loop.running]
        return await super().write(appends, watch)


async def test_a_cancel_before_finish_counts_once_as_cancelled(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, 60)
    loop = await _loop(aredis, store, "r19-raced")
    CancelBeforeFinish.on(aredis, store, loop)
    cancelled, succeeded = _finished("cancelled"), _finished("succeeded")
    events = await _run(aredis, "r19-raced", loop)
    record = await _record(store, "r19-raced")
    assert record.status == JobStatus.CANCELLED
    assert _finished("cancelled") - cancelled == 1  # counted once, in the state it shows
    assert _finished("succeeded") == succeeded
    finals = [event for event in events if event.final]
    assert [final.status for final in finals] == [JobStatus.CANCELLED], finals
    assert finals[0].finish_reason == "abort" and finals[0].usage == usage_of(3, 3)


async def test_a_job_that_ends_normally_is_not_read_again(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, 60)
    loop = await _loop(aredis, store, "r19-plain")
    tokens = ReadsAfterTheEnd(aredis, KEYS, 60)
    tokens.loop, tokens.late_reads = loop, []
    loop.tokens = tokens
    succeeded = _finished("succeeded")
    events = await _run(aredis, "r19-plain", loop)
    assert tokens.late_reads == []  # FINISH's reply is all its end reads
    assert _finished("succeeded") - succeeded == 1
    assert [event.status for event in events if event.final] == [JobStatus.SUCCEEDED]

"""An EventSource reconnects after every stream, so after its job's `final` too, with that
final's id. While the job's token stream lives the resume is told 204 (nothing follows); once
the stream expired (CONVEYOR_TOKEN_STREAM_TTL_S) the producer could no longer tell the final's
id from a token's, and the same reconnect got the job's whole text again (`restart`, `token`,
`final`): text its client had. APPEND now keeps the id of the final it appends in the job's
hash (`final_event`), so the resume is told 204 without the stream; a resume after a token's id
still gets the whole text again. Real processes: Valkey, a producer, a worker serving `paced`."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis

from conveyor.stack import Stack
from shared.keys import Keys, new_job_id
from shared.token_scripts import FINAL_EVENT
from shared.token_stream import TokenEvent
from tests.test_events_resume import (
    _open,
    _ran,
    paced,  # noqa: F401 (a fixture)
)
from workers.partition.token_writer import TokenAppend, TokenWriter

KEYS = Keys("r38final:")


@pytest.mark.slow
def test_a_resume_after_the_final_is_told_204_after_the_stream_expired(
    paced: Stack,  # noqa: F811
) -> None:
    job_id = _ran(paced)
    status, events = _open(paced, job_id)
    assert status == 200 and [e["event"] for e in events[-2:]] == ["token", "final"], events
    token_id, final_id = events[-2]["id"], events[-1]["id"]
    client = redis.Redis.from_url(paced.redis_url, decode_responses=True)
    try:
        assert client.hget(Keys().job(job_id), FINAL_EVENT) == final_id
        client.delete(Keys().tokens(job_id))  # as its TTL will: the reader cannot tell the two
    finally:
        client.close()

    assert _open(paced, job_id, final_id) == (204, [])
    status, retold = _open(paced, job_id, token_id)  # its text may be cut: all of it again
    assert status == 200 and [e["event"] for e in retold] == ["restart", "token", "final"]


async def test_a_final_is_kept_in_a_terminal_hash_only(aredis: aioredis.Redis) -> None:
    """A final for a job whose hash is gone creates none (it would live for ever), and one for
    a job not ended yet names no final of the record's."""
    writer = TokenWriter(aredis, KEYS, 60)
    final = TokenEvent("final", status="succeeded", finish_reason="stop")
    gone, running = new_job_id("m", "default"), new_job_id("m", "default")
    await aredis.hset(KEYS.job(running), "status", "running")

    await writer.write([TokenAppend(job, "run-a", 1, [final], True) for job in (gone, running)], [])

    assert await aredis.exists(KEYS.job(gone)) == 0
    assert await aredis.hget(KEYS.job(running), FINAL_EVENT) is None

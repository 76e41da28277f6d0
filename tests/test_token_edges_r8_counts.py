"""A generate engine's token count that is an integer but not Python's own (numpy's, as an
engine that counts with numpy yields it): `checked` takes it, as it takes any integer, but the
token event carried it to redis-py as it came, which refuses it (DataError) while it packs the
tick's round trip: no job's events were written, and the error, no outage, stopped the loop that
writes every job's tokens. On a real Valkey."""

from __future__ import annotations

from typing import Any

import numpy as np
import redis.asyncio as aioredis

from shared.keys import Keys, new_job_id
from shared.token_stream import TokenEvent, usage_of
from workers.engines.base import TokenChunk
from workers.generation.generate_job import checked
from workers.partition.token_writer import TokenAppend, TokenWriter

KEYS = Keys("tokcount:")
NUMPY: Any = np.int64  # an integer the TokenChunk type does not name, as engines yield it


def _events(chunk: TokenChunk) -> list[TokenEvent]:
    """The events a job makes of its engine's last chunk (workers/generation/generate_job.py)."""
    chunk = checked(chunk)
    usage = usage_of(chunk.prompt_tokens, chunk.completion_tokens)
    return [
        TokenEvent("token", text=chunk.text, tokens=chunk.token_count),
        TokenEvent("final", status="succeeded", finish_reason=chunk.finish_reason, usage=usage),
    ]


async def test_a_numpy_token_count_is_written_beside_the_other_jobs_events(
    aredis: aioredis.Redis,
) -> None:
    plain, numpy = new_job_id("m", "default"), new_job_id("m", "default")
    counted = TokenChunk("end", NUMPY(2), "stop", NUMPY(5), NUMPY(7))
    appends = [
        TokenAppend(plain, "run-a", 1, _events(TokenChunk("end", 1, "stop", 5, 6)), expire=True),
        TokenAppend(numpy, "run-b", 1, _events(counted), expire=True),
    ]

    written = await TokenWriter(aredis, KEYS, 60).write(appends, [])

    assert written.refused == []
    assert await aredis.xlen(KEYS.tokens(plain)) == 2
    rows: Any = await aredis.xrange(KEYS.tokens(numpy))
    (token_id, token), (final_id, final) = rows
    assert TokenEvent.decode(token_id, token).data() == {"text": "end", "tokens": 2}
    assert TokenEvent.decode(final_id, final).usage == usage_of(5, 7)

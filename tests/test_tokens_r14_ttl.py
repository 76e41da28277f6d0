"""The TTL of a token stream that a run's later write recreates, on a real Valkey with the
worker's TokenWriter: only a run's first and final writes set the TTL, so a stream lost while
its job ran (evicted under a volatile maxmemory policy, or behind in the replica that a
failover promoted) came back from the next tick's XADD with none, and lived for ever."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.keys import Keys, new_job_id
from shared.token_stream import TokenEvent
from workers.partition.token_writer import TokenAppend, TokenWriter

KEYS = Keys("r14ttl:")
RESULT_TTL_S = 3600


def _token(text: str) -> list[TokenEvent]:
    return [TokenEvent("token", text=text, tokens=1)]


async def test_a_stream_lost_mid_run_comes_back_with_the_result_ttl(
    aredis: aioredis.Redis,
) -> None:
    writer, job_id = TokenWriter(aredis, KEYS, RESULT_TTL_S), new_job_id("m", "default")
    stream = KEYS.tokens(job_id)
    await writer.write([TokenAppend(job_id, "run-a", 1, _token("A "), expire=True)], [])
    await aredis.delete(stream)  # evicted, or lost in a failover
    await writer.write([TokenAppend(job_id, "run-a", 2, _token("B "), expire=False)], [])
    assert await aredis.xlen(stream) == 1
    assert 0 < await aredis.ttl(stream) <= RESULT_TTL_S


async def test_a_later_write_leaves_the_streams_ttl_as_it_is(aredis: aioredis.Redis) -> None:
    """The recreated stream's TTL is set where it has none only: a later write that set the
    result TTL on every tick would give a stream `TokenWriter.ended` cut short a day again."""
    writer, job_id = TokenWriter(aredis, KEYS, RESULT_TTL_S), new_job_id("m", "default")
    stream = KEYS.tokens(job_id)
    await writer.write([TokenAppend(job_id, "run-a", 1, _token("A "), expire=True)], [])
    await aredis.expire(stream, 30)
    await writer.write([TokenAppend(job_id, "run-a", 2, _token("B "), expire=False)], [])
    assert 0 < await aredis.ttl(stream) <= 30

"""A worker's heartbeat on a connection that went silent (a failover's old host gone without a
FIN or RST, a NAT that dropped it) waited the whole CONVEYOR_REDIS_TIMEOUT_S, then a whole period
before its next try: the record was rewritten `period + timeout + period` after its last beat,
past any TTL under that (4 s at a 1 s period and the default 2 s timeout), and the live worker,
Redis up all along, read as gone (no consumer for its partitions, `scaling` events,
autoscaling). A beat's wait on Redis, and the pause before the try after a failed one, now fit
a failed beat and its retry inside the TTL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis.asyncio as aioredis

from shared.keys import Keys
from shared.settings import Settings
from tests.conftest import REPO_ROOT
from tests.test_reply_message import _SilentProxy
from workers.runtime.consumer_runtime import consumer_name
from workers.runtime.heartbeat import _Beater, beat_timeout_s

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"
# A pair the settings' validator takes, and a Redis timeout past the TTL: a beat that waited it
# out loses the record by seconds; one bounded by the TTL's slack keeps it by ~2 s, a margin
# a busy machine's scheduling does not eat.
PERIOD_S, TTL_S, REDIS_TIMEOUT_S = 0.2, 6, 10.0


async def _next_beat(client: aioredis.Redis, key: str, after: bytes | None) -> bytes:
    """The record's `last_beat` once a beat other than `after` wrote it; fails the test if the
    record is absent meanwhile (after a first beat)."""
    async with asyncio.timeout(15):
        while (written := await client.hget(key, "last_beat")) in (None, after):
            assert written is not None or after is None, "the live worker's record expired"
            await asyncio.sleep(0.01)
    return written


async def test_a_beat_lost_on_a_silent_connection_is_retried_inside_the_ttl(
    redis_url: str, settings_env: Callable[..., None]
) -> None:
    # the client's timeout is the process's setting (`connect`), as it is a worker's
    settings_env(CONVEYOR_REDIS_TIMEOUT_S=str(REDIS_TIMEOUT_S))
    proxy = _SilentProxy(redis_url)
    server = await proxy.start()
    settings = Settings(
        redis_url=f"redis://127.0.0.1:{proxy.port}/0",
        model_repository=FIXTURES,
        models=["tiny"],
        worker_heartbeat_s=PERIOD_S,
        worker_heartbeat_ttl_s=TTL_S,
        redis_timeout_s=REDIS_TIMEOUT_S,
    )
    key = Keys().worker(consumer_name())
    direct = aioredis.from_url(redis_url)
    await direct.delete(key)
    beater = _Beater(object(), settings)
    beater.start()
    try:
        # the worst moment: just after a beat, the next one the first on the dead connection
        written = await _next_beat(direct, key, await _next_beat(direct, key, None))
        proxy.silence()
        await _next_beat(direct, key, written)  # on a new connection, the record never gone
        assert 0 < await direct.ttl(key) <= TTL_S
    finally:
        await asyncio.to_thread(beater.stop)  # the proxy serves on this loop meanwhile
        await direct.delete(key)
        await direct.aclose()
        server.close()


def test_a_beat_waits_the_redis_timeout_unless_the_ttl_leaves_less() -> None:
    assert beat_timeout_s(Settings()) == 2.0  # a 2 s period and a 10 s TTL: as before
    short = Settings(worker_heartbeat_s=PERIOD_S, worker_heartbeat_ttl_s=TTL_S)
    assert beat_timeout_s(short) == (TTL_S - PERIOD_S) / 3
    assert beat_timeout_s(short.model_copy(update={"redis_timeout_s": 0.1})) == 0.1

"""Worker heartbeats: the one owner of `cv:{ctl}worker:{name}` (a hash with a TTL, rewritten every
few seconds by each worker) and the `cv:{ctl}workers` index (sorted set by heartbeat ms, on
Redis's clock). Workers publish; the producer's console lists. A worker that dies simply stops
beating: its hash expires and `live()` leaves it out, so nobody has to clean up after a kill -9."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import redis.asyncio as aioredis

from shared.backlog import ServiceCost, queue_cost_write
from shared.codec import as_text, dumps, loads
from shared.keys import Keys
from shared.redis_client import hgetall_many
from shared.redis_clock import CLOCK
from shared.settings import Settings

WorkerState = Literal["warming", "serving", "draining"]
# CONVEYOR_WORKER_HEARTBEAT_TTL_S's default: a record expires this long after its last beat, so
# a worker is gone after missing TTL / period beats.
TTL_S: int = Settings.model_fields["worker_heartbeat_ttl_s"].default
# KEYS[1]=the index; ARGV: the worker, its TTL. Indexes the worker at Redis's time and drops those
# that last beat a TTL before it, the index itself with the last of them. Judged by each host's
# clock, a worker running a TTL fast dropped every other worker from the list, and a reader's
# clock judged one running slow dead while its heartbeat lived.
_INDEX = """
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - tonumber(ARGV[2]) * 1000)
redis.call('EXPIRE', KEYS[1], ARGV[2])
"""


@dataclass(slots=True)
class Heartbeat:
    """What a worker says about itself on every beat."""

    name: str
    host: str
    pid: int
    state: WorkerState
    models: list[str] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)
    batch_size: float = 0.0
    jobs_done: int = 0
    started_at: float = 0.0
    last_beat: float = 0.0

    def to_fields(self) -> dict[str, str]:
        return {name: as_text(dumps(value)) for name, value in asdict(self).items()}

    @classmethod
    def from_fields(cls, raw: dict[bytes, bytes]) -> Heartbeat:
        values = {as_text(k): loads(v) for k, v in raw.items()}
        known = {name: values[name] for name in cls.__dataclass_fields__ if name in values}
        return cls(**known)


class WorkerRegistry:
    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int = TTL_S) -> None:
        """`ttl_s`: how long a record `publish` writes lives (CONVEYOR_WORKER_HEARTBEAT_TTL_S);
        readers (`live`, `remove`) need none, the TTLs being Redis's own."""
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s

    async def publish(
        self, beat: Heartbeat, costs: Mapping[tuple[str, str], ServiceCost] | None = None
    ) -> None:
        """Rewrite the worker's hash, renew its TTL and index it (`_INDEX`), in one transaction.
        The same transaction carries the worker's latest measured cost of each (model, variant)
        it ran (shared/backlog.py)."""
        beat.last_beat = CLOCK.now()  # Redis's clock: a console on another host reads it
        key = self.keys.worker(beat.name)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=beat.to_fields())  # type: ignore[arg-type]
            pipe.expire(key, self.ttl_s)
            pipe.execute_command("EVAL", _INDEX, 1, self.keys.workers, beat.name, self.ttl_s)
            for (model, variant), cost in (costs or {}).items():
                queue_cost_write(pipe, self.keys, model, variant, cost)
            await pipe.execute()

    async def remove(self, name: str) -> None:
        """A worker that exits cleanly leaves the list at once."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.worker(name))
            pipe.zrem(self.keys.workers, name)
            await pipe.execute()

    async def live(self) -> list[Heartbeat]:
        """Every worker whose heartbeat has not expired, by name: two round trips however many.
        The index holds only workers that beat within a TTL (`_INDEX`); their hashes' TTLs say
        which still live, by Redis's clock, not this host's."""
        names: Any = await self.redis.zrangebyscore(self.keys.workers, "-inf", "+inf")
        if not names:
            return []
        rows = await hgetall_many(self.redis, [self.keys.worker(as_text(name)) for name in names])
        beats = [Heartbeat.from_fields(row) for row in rows if row]
        return sorted(beats, key=lambda beat: beat.name)

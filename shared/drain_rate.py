"""How fast lanes drain, the one reading of the per-second drained counters FINISH keeps
(`{lane}:drained:{second}`): what a 429's Retry-After and a queued job's ETA are derived from;
and how many jobs wait in them, which tells a drain rate that is the workers' capacity (they had
work waiting) from one that is only the arrival rate: undelivered entries, and a fair lane's held
jobs (its flood waits mostly outside the stream); and, for a rate over the busy time alone, what
finished between two reads and how long ago the oldest job there arrived."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from shared.codec import as_text
from shared.job_scripts import LUA_FIELD, LUA_UNDELIVERED
from shared.keys import FAIR_SINCE_SUFFIX, FAIR_SUFFIX, GROUP, Keys
from shared.partition_stats import wrong_type
from shared.redis_clock import CLOCK

# KEYS: lanes sharing one hash tag (a partition's two); ARGV[1]: the group. Jobs waiting in each:
# entries no consumer has been handed yet, as the POSITION script counts them, plus those a fair
# lane holds back (its fair hash's `held`; a worker's read can leave its stream with none
# undelivered while a flood waits); then the entries in flight in them all (handed over, not yet
# acknowledged: XLEN - undelivered), then the age in ms, on the server's clock, of the oldest job
# waiting in them (0: none): by its entry's id (its arrival), or its submit stamp where older
# (`enq`: a fair lane moves a held job in under a new id, which read a flood as just arrived), or
# the oldest held job's (the lane's `{lane}:fair:since` set), then each consumer holding entries
# in them and how many (XPENDING's summary, name after count: a dead worker's stay until
# reclaimed). The oldest waiting entry is the first after the last one pending (acknowledged
# entries are deleted, so every earlier one is in flight): the stream's first, a long job or a
# dead worker's entry in hand, read a burst as waiting since before the last look, which timed
# it from there, and a light load's arrivals measured as the workers' capacity.
# Sent as EVAL, which a cluster pipeline routes without loading.
WAITING = (
    LUA_UNDELIVERED
    + LUA_FIELD
    + f"""
local waiting, in_flight, oldest, holders = {{}}, 0, 0, {{}}
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
for i, stream in ipairs(KEYS) do
  local held = tonumber(redis.call('HGET', stream .. '{FAIR_SUFFIX}', 'held')) or 0
  local unread = undelivered(stream, ARGV[1])
  waiting[i] = math.max(0, unread) + math.max(0, held)
  in_flight = in_flight + redis.call('XLEN', stream) - unread
  local ok, pel = pcall(redis.call, 'XPENDING', stream, ARGV[1])
  local after = ok and pel[3] and '(' .. pel[3] or '-'
  local first = redis.call('XRANGE', stream, after, '+', 'COUNT', 1)[1]
  local since = redis.call('ZRANGE', stream .. '{FAIR_SINCE_SUFFIX}', 0, 0, 'WITHSCORES')[2]
  local arrived = tonumber(since) or math.huge
  if first then
    local enq = tonumber(field(first[2], 'enq')) or math.huge
    arrived = math.min(arrived, enq, tonumber(string.match(first[1], '^%d+')))
  end
  if arrived < math.huge then oldest = math.max(oldest, now_ms - arrived) end
  for _, holder in ipairs(ok and pel[4] or {{}}) do
    holders[holder[1]] = (holders[holder[1]] or 0) + tonumber(holder[2])
  end
end
waiting[#KEYS + 1] = in_flight
waiting[#KEYS + 2] = oldest
for name, count in pairs(holders) do
  table.insert(waiting, name)
  table.insert(waiting, count)
end
return waiting
"""
)


@dataclass(frozen=True, slots=True)
class LaneBacklog:
    """A group of lanes' (a partition's) drain rates and jobs waiting, lane by lane, and the
    entries its workers have in hand: a partition that finished nothing lately is idle only
    with none in flight (else its workers are busy on long jobs). `read_s` (Unix s), `drained`
    (entries finished per second, its lanes summed) and `oldest_s` (how long ago its oldest job
    waiting arrived) let two reads tell how much finished in between, and since when work
    waited; `holders`, the entries in flight by the consumer holding them."""

    rates: list[float]
    waiting: list[int]
    in_flight: int
    read_s: float = 0.0
    drained: dict[int, int] = field(default_factory=dict)
    oldest_s: float = 0.0
    holders: dict[str, int] = field(default_factory=dict)

    @property
    def window_from_s(self) -> float:
        """When (Unix s) the rate window read began: its first second."""
        return min(self.drained, default=self.read_s)

    @property
    def stalled_s(self) -> float:
        """How long work has waited with nothing finished: since the end of the last second
        anything finished in, or the oldest job waiting arrived if later (a burst after an idle
        spell waited only since it came); 0 while none waits."""
        if not any(self.waiting):
            return 0.0
        finished = max((second + 1 for second, count in self.drained.items() if count), default=0)
        return max(0.0, self.read_s - max(finished, self.read_s - self.oldest_s))

    def in_flight_at(self, workers: Collection[str]) -> int:
        """Entries in flight at `workers` (live ones): a dead worker's stay in its pending list
        until reclaimed, while the live ones may have nothing in hand."""
        return sum(count for name, count in self.holders.items() if name in workers)

    def finished_since(self, earlier: LaneBacklog) -> int:
        """Entries finished between `earlier`'s read and this one: each second's counter now
        less what it held then (a second gone from this read's window had ended by then)."""
        return sum(
            max(0, count - earlier.drained.get(second, 0)) for second, count in self.drained.items()
        )


@dataclass(frozen=True, slots=True)
class _Window:
    """The seconds a rate is read over: the last `window_s` complete ones and the part of this
    one gone by, so that a lane that began draining this second is not read as idle, and a
    partial second does not read as a slow one."""

    seconds: range
    span_s: float
    now: float

    @classmethod
    def last(cls, window_s: int) -> _Window:
        """The window ending now on Redis's clock, the one each worker's FINISH files its
        counts by: a producer off it read the seconds a skew away from those just drained."""
        now = CLOCK.now()
        second = int(now)
        return cls(range(second - window_s, second + 1), window_s + now - second, now)

    def read(self, pipe: Any, keys: Keys, stream: str) -> None:
        """Queue the lane's counters: they share its hash tag, so one MGET (sent as a raw
        command: a cluster pipeline refuses its `mget`, made for keys of any slot)."""
        pipe.execute_command("MGET", *(keys.drained(stream, s) for s in self.seconds))

    def rate(self, counts: Sequence[bytes | None]) -> float:
        return sum(int(count) for count in counts if count) / self.span_s

    def per_second(self, lanes: Sequence[Sequence[bytes | None]]) -> dict[int, int]:
        """The lanes' counters summed, second by second."""
        return {
            second: sum(int(counts[i] or 0) for counts in lanes)
            for i, second in enumerate(self.seconds)
        }


async def drain_rates(
    client: aioredis.Redis, keys: Keys, streams: Sequence[str], window_s: int
) -> list[float]:
    """Entries each lane finished per second over the last `window_s` seconds (`_Window`), in
    one round trip: a cluster pipeline sends each node its lanes at once."""
    window = _Window.last(window_s)
    async with client.pipeline(transaction=False) as pipe:
        for stream in streams:
            window.read(pipe, keys, stream)
        lanes = await pipe.execute()
    return [window.rate(counts) for counts in lanes]


async def drain_rates_and_waiting(
    client: aioredis.Redis, keys: Keys, lanes: Sequence[Sequence[str]], window_s: int
) -> list[LaneBacklog | None]:
    """Each group of `lanes` (lanes that share a hash tag: a partition's online and bulk ones):
    its lanes' drain rates (as `drain_rates`) and counters, jobs waiting, entries in flight (and
    who holds them) and the oldest job's age (`WAITING`), all in one round trip: a group's
    MGETs and one EVAL go to its node together. None for a group one of whose keys is of
    another type (an operator's slip), left out as the queue state leaves it out: its EVAL
    failed the read of every group."""
    window = _Window.last(window_s)
    async with client.pipeline(transaction=False) as pipe:
        for group in lanes:
            for stream in group:
                window.read(pipe, keys, stream)
            pipe.execute_command("EVAL", WAITING, len(group), *group, GROUP)
        replies = iter(await pipe.execute(raise_on_error=False))
    return [_backlog(window, [next(replies) for _ in group], next(replies)) for group in lanes]


def _backlog(window: _Window, counts: list[Any], waiting: Any) -> LaneBacklog | None:
    """A group's backlog from its MGET replies and its `WAITING` reply; None when a key of it
    is of another type, any other error raised."""
    errors = [reply for reply in (*counts, waiting) if isinstance(reply, Exception)]
    if failure := next((error for error in errors if not wrong_type(error)), None):
        raise failure
    if errors:
        return None
    lanes = len(counts)
    jobs = [int(count) for count in waiting[:lanes]]
    in_flight, oldest_ms = (int(count) for count in waiting[lanes : lanes + 2])
    names, holding = waiting[lanes + 2 :: 2], waiting[lanes + 3 :: 2]
    holders = {as_text(name): int(count) for name, count in zip(names, holding, strict=True)}
    rates = [window.rate(lane) for lane in counts]
    oldest_s = max(0, oldest_ms) / 1000
    drained = window.per_second(counts)
    return LaneBacklog(rates, jobs, in_flight, window.now, drained, oldest_s, holders)

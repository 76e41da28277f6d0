"""The one owner of canary state in Redis: `cv:canary:{model}` (hash, `doc`: the rollout as
JSON, `start_call` and `save_call`: the tokens of the calls that started it and saved it last),
its decisions `cv:canary:{model}:events` (list), `cv:canaries` (set of models with one running)
and `cv:canary:{model}:lock` (a decision, a start, an abort: one at a time). State lives here,
not in a process, so a canary outlives the producer that drives it: whichever producer leads
next picks it up where it stood. So do its webhooks: a decision's delivery is owed (a field
`owed:<event id>` of the canary hash, its URL and body) from the step that saves it until the
broker has it, and a canary that ended stays in the active set while it owes one, so the next
leader's look hands over what a producer that died in between never did."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.lock import Lock
from redis.typing import EncodableT

from shared.canary_steps import default_max_step_s
from shared.codec import as_text, dumps, loads
from shared.keys import Keys
from shared.leader_lock import LeaderLock
from shared.redis_clock import CLOCK

CanaryState = Literal["running", "completed", "rolled_back", "aborted"]
EVENTS_KEPT = 500
LOCK_S = 10.0  # a decision or an abort takes milliseconds; a holder that died frees it then

# KEYS[1]=canary hash, KEYS[2]=active set, KEYS[3]=events; ARGV: doc JSON, model, the call's
# token, the `started` event JSON ('' none). Starts unless one is running; one running that this
# call's token started is its own, rerun (its reply was lost): the doc alone cannot tell, two
# starts of one caller in one millisecond write the same. A start drops the last canary's events
# with its record: they were shown as the new one's decisions (its `aborted` under the new one's
# `started`). Its own event is written in the same step: saved by a second call, a Redis error
# between the two answered 500 for a canary that ran with no `started` event. Its webhook
# (ARGV[5] the field, ARGV[6] the delivery, '' none) is owed in the same step; the last canary's
# owed ones stay, for the look to hand over.
_START = """
local doc = redis.call('HGET', KEYS[1], 'doc')
if doc and cjson.decode(doc).state == 'running' then
  return redis.call('HGET', KEYS[1], 'start_call') == ARGV[3] and 1 or 0
end
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'start_call', ARGV[3])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], ARGV[5], ARGV[6]) end
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[3])
if ARGV[4] ~= '' then redis.call('RPUSH', KEYS[3], ARGV[4]) end
return 1
"""
# KEYS[1]=canary hash, KEYS[2]=active set, KEYS[3]=events, KEYS[4] (fenced saves only)=traffic
# lease; ARGV: doc JSON, the model to drop from the active set ('' while running), the decision's
# event JSON ('' none), EVENTS_KEPT, the call's token, the owed webhook's field and delivery (''
# none: an ended canary that owes one stays in the active set until `_SETTLE`), the lease's
# owner. A leader's save is
# refused once its lease is another's (a pause past it let a second leader decide): checked and
# written in one step, so a stale leader never writes over the new one's. The event is written
# in the same step: recorded after the save, a Redis error between the two lost it for good (the
# next look found the record as decided, nothing to take up), an ended canary's last word among
# them. A save whose token is the last one's is its own, rerun (its reply was lost): the client
# resends scripts, and its event was logged twice.
_SAVE = """
if redis.call('HGET', KEYS[1], 'save_call') == ARGV[5] then return 1 end
if KEYS[4] and redis.call('GET', KEYS[4]) ~= ARGV[8] then return 0 end
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'save_call', ARGV[5])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[6], ARGV[7])
elseif ARGV[2] ~= '' then
  redis.call('SREM', KEYS[2], ARGV[2])
end
if ARGV[3] ~= '' then
  redis.call('RPUSH', KEYS[3], ARGV[3])
  redis.call('LTRIM', KEYS[3], -tonumber(ARGV[4]), -1)
end
return 1
"""
# KEYS[1]=canary hash, KEYS[2]=active set; ARGV: the owed field the broker has, the model. The
# canary leaves the active set with its last owed webhook once it has ended (a new one running
# in its place stays).
_SETTLE = """
redis.call('HDEL', KEYS[1], ARGV[1])
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(name, 1, 5) == 'owed:' then return 0 end
end
local doc = redis.call('HGET', KEYS[1], 'doc')
if not doc or cjson.decode(doc).state ~= 'running' then redis.call('SREM', KEYS[2], ARGV[2]) end
return 1
"""
OWED = "owed:"  # the prefix of a canary hash's owed webhook fields, as the scripts spell it


def _call_token() -> str:
    """A script call's own token, by which its rerun (the client resends scripts) knows itself."""
    return uuid.uuid4().hex[:16]


class NotLeading(Exception):
    """The traffic lease this producer decided under is no longer its own."""


def stamp() -> float:
    """Now on Redis's clock in seconds, to the millisecond, for a canary's start and its
    events alike (and a routes change's): rounded the same way, the `started` event is never
    earlier than the canary's `started_at`; on one clock, whichever producer reads them next
    reads them as the one that wrote them did."""
    return round(CLOCK.now(), 3)


@dataclass(slots=True)
class Canary:
    """One rollout: `variant` climbs `steps` (percent of traffic) against `baseline`."""

    model: str
    variant: str
    baseline: str
    steps: list[float]
    interval_s: float
    max_error_rate: float
    max_p99_ms: float
    min_requests: int
    webhook: str = ""
    by: str = ""
    state: CanaryState = "running"
    step: int = -1  # index into steps; -1 before the first
    weight: float = 0.0
    started_at: float = field(default_factory=stamp)
    step_started_at: float = 0.0
    # The other primaries' weights before the canary, or when last seen with traffic once an
    # operator changed their ratios: what a rollback hands the traffic back to (none seen: all
    # to the baseline).
    others: dict[str, float] = field(default_factory=dict)
    # How long a step may stay short of `min_requests` before it rolls back (a variant whose
    # workers never take a job left its share of users waiting for ever); 0: the default.
    max_step_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.max_step_s:  # not given, or stored before there was one
            self.max_step_s = default_max_step_s(self.interval_s)

    def to_json(self) -> bytes:
        return dumps(asdict(self))

    @classmethod
    def of(cls, raw: bytes | str) -> Canary:
        return cls(**loads(raw))


@dataclass(frozen=True, slots=True)
class OwedWebhook:
    """A decision's webhook delivery, owed from the save of the decision until the broker has
    it: `body` keeps its event id, so a re-send is the same event, which receivers drop."""

    url: str
    body: dict[str, Any]

    @property
    def field(self) -> str:
        return f"{OWED}{self.body['id']}"

    def args(self) -> list[EncodableT]:
        """The scripts' owed field and delivery JSON."""
        return [self.field, dumps({"url": self.url, "body": self.body})]

    @classmethod
    def of(cls, raw: bytes | str) -> OwedWebhook:
        return cls(**loads(raw))


_NOTHING_OWED: list[EncodableT] = ["", ""]


class CanaryStore:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self._start = client.register_script(_START)
        self._save = client.register_script(_SAVE)
        self._settle = client.register_script(_SETTLE)

    async def start(
        self, canary: Canary, event: dict[str, Any] | None = None, owed: OwedWebhook | None = None
    ) -> bool:
        """Store a new running canary in place of the last one, its events with it, its
        `started` `event` and its `owed` webhook, if any, in one step; False if the model has
        one running already (not one this call started: the client reruns a script whose reply
        was lost)."""
        model = canary.model
        keys = [self.keys.canary(model), self.keys.canaries_active, self.keys.canary_events(model)]
        started = dumps(event) if event else ""
        args: list[EncodableT] = [canary.to_json(), canary.model, _call_token(), started]
        args += owed.args() if owed else _NOTHING_OWED
        return bool(await self._start(keys=keys, args=args))

    def lock(self, model: str, wait_s: float | None) -> Lock:
        """The lock that serializes a model's canary decisions (the leader's) with its start
        and abort (any producer's), so none acts on a state another has just changed.
        `wait_s`: how long to wait for it (None: not at all). It expires after LOCK_S should its
        holder die."""
        blocking = wait_s is not None
        return self.redis.lock(
            self.keys.canary_lock(model),
            timeout=LOCK_S,
            blocking=blocking,
            blocking_timeout=wait_s,
            raise_on_release_error=False,  # expired under a holder that outlived LOCK_S
        )

    async def get(self, model: str) -> Canary | None:
        raw = await self.redis.hget(self.keys.canary(model), "doc")
        return Canary.of(raw) if raw is not None else None

    async def owing(self, model: str) -> tuple[Canary | None, list[OwedWebhook]]:
        """The canary, as `get` reads it, and the webhooks it owes, oldest first, in `get`'s
        one round trip: a look that decides nothing costs what it did."""
        fields = {
            as_text(k): v for k, v in (await self.redis.hgetall(self.keys.canary(model))).items()
        }
        canary = Canary.of(fields["doc"]) if "doc" in fields else None
        owed = [OwedWebhook.of(v) for k, v in fields.items() if k.startswith(OWED)]
        return canary, sorted(owed, key=lambda o: o.body["data"].get("at", 0))  # the event's stamp

    async def settle(self, model: str, owed: OwedWebhook) -> None:
        """The broker has `owed`: no longer owed, and an ended canary that owes nothing more
        leaves the active set."""
        keys = [self.keys.canary(model), self.keys.canaries_active]
        await self._settle(keys=keys, args=[owed.field, model])

    async def save(
        self,
        canary: Canary,
        lease: LeaderLock | None = None,
        event: dict[str, Any] | None = None,
        owed: OwedWebhook | None = None,
    ) -> None:
        """Store its new state, the `event` that decided it and its `owed` webhook, if any, in
        one step; a canary that ended leaves the active set, once it owes no webhook (`settle`).
        `lease`: the leader's, which must still be its own (NotLeading); None for a start or an
        abort, which any producer may make."""
        model = canary.model
        keys = [self.keys.canary(model), self.keys.canaries_active, self.keys.canary_events(model)]
        ended = model if canary.state != "running" else ""
        args: list[EncodableT] = [
            canary.to_json(),
            ended,
            dumps(event) if event else "",
            EVENTS_KEPT,
            _call_token(),
            *(owed.args() if owed else _NOTHING_OWED),
        ]
        if lease is not None:
            keys.append(lease.key)
            args.append(lease.owner)
        if not await self._save(keys=keys, args=args):
            raise NotLeading(model)

    async def active(self) -> list[str]:
        return sorted(as_text(m) for m in await self.redis.smembers(self.keys.canaries_active))

    async def events(self, model: str, limit: int = 100) -> list[dict[str, Any]]:
        rows = await self.redis.lrange(self.keys.canary_events(model), -limit, -1)
        return [loads(row) for row in rows]

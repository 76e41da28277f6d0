"""The one owner of live routes in Redis: `cv:{ctl}routes:{model}` (hash: `doc` JSON,
`version`, `change`: the id of the call that wrote them), its change log
`cv:{ctl}routes:{model}:log` (who, when, old → new) and the global counter
`cv:{ctl}routes-version` producers poll. A change is one Lua script, so the version, the log and
the counter never disagree, a writer that names the version it read cannot lose a race, and the
traffic leader's write is refused once its lease is another's."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from shared.canary_store import NotLeading, stamp
from shared.codec import as_text, dumps, loads
from shared.keys import Keys
from shared.leader_lock import LeaderLock
from shared.model_repository import ModelConfig
from shared.routing import Routes, seed_routes, served_routes

LOG_LENGTH = 1_000
_NOT_LEADING = -2  # PUT's answer when the fencing lease is another's

# KEYS[1]=routes hash, KEYS[2]=log, KEYS[3]=global version, KEYS[4] (fenced puts only)=traffic
# lease; ARGV: new doc JSON, who, unix time, expected version ('' for any), only-if-absent
# ('1'/'0'), log length, the change's id, the lease's owner. Returns {version, changed}
# (changed: 1 written, 0 left as it was, -1 expected version stale, -2 the lease is another's).
# The routes last written by this change's id are its own, rerun (its reply was lost): written,
# once. The lease is checked in the same step as the write: a leader paused after it decided
# while another producer took the lease over cannot write its stale routes.
_PUT = """
local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if redis.call('HGET', KEYS[1], 'change') == ARGV[7] then return {current, 1} end
if KEYS[4] and redis.call('GET', KEYS[4]) ~= ARGV[8] then return {current, -2} end
if ARGV[5] == '1' and current > 0 then return {current, 0} end
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= current then return {current, -1} end
local old = redis.call('HGET', KEYS[1], 'doc') or 'null'
local version = current + 1
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'version', version, 'change', ARGV[7])
redis.call('RPUSH', KEYS[2], '{"version":' .. version .. ',"at":' .. ARGV[3] .. ',"by":'
  .. cjson.encode(ARGV[2]) .. ',"old":' .. old .. ',"new":' .. ARGV[1] .. '}')
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[6]), -1)
redis.call('INCR', KEYS[3])
return {version, 1}
"""


class VersionConflict(Exception):
    """The routes changed since the writer read them (its expected version is stale)."""

    def __init__(self, current: int) -> None:
        super().__init__(f"routes are at version {current}")
        self.current = current


@dataclass(frozen=True, slots=True)
class RouteChange:
    version: int
    at: float
    by: str
    old: dict[str, Any] | None
    new: dict[str, Any]


class RouteStore:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self._put = client.register_script(_PUT)

    async def put(
        self,
        model: str,
        routes: Routes,
        by: str,
        expected: int | None = None,
        lease: LeaderLock | None = None,
    ) -> int:
        """Store `routes` as the next version (checked by the caller) and log the change. The
        client reruns a script whose reply was lost: the rerun answers the version the first
        run wrote, not a conflict with it, and logs nothing twice. `lease`: the traffic
        leader's, which must still be its own when the script writes (NotLeading); None for an
        operator's change, which any producer may make."""
        version, changed = await self._call(
            model, routes, by, expected, only_if_absent=False, lease=lease
        )
        if changed == _NOT_LEADING:
            raise NotLeading(model)
        if changed < 0:
            raise VersionConflict(version)
        return version

    async def seed(self, model: str, routes: Routes) -> None:
        """Write config.yaml's routes as version 1 unless the model has live routes already."""
        await self._call(model, routes, "config.yaml", None, only_if_absent=True, lease=None)

    async def _call(
        self,
        model: str,
        routes: Routes,
        by: str,
        expected: int | None,
        only_if_absent: bool,
        lease: LeaderLock | None,
    ) -> tuple[int, int]:
        keys = [self.keys.routes(model), self.keys.routes_log(model), self.keys.routes_version]
        args: list[str | bytes | int | float] = [
            dumps(routes.document()),
            by,
            stamp(),
            "" if expected is None else expected,
            "1" if only_if_absent else "0",
            LOG_LENGTH,
            uuid.uuid4().hex[:16],
        ]
        if lease is not None:
            keys.append(lease.key)
            args.append(lease.owner)
        version, changed = await self._put(keys=keys, args=args)
        return int(version), int(changed)

    async def get_many(self, models: Iterable[str]) -> dict[str, Routes]:
        """Every named model's live routes in one round trip (models without any are left out)."""
        names = list(models)
        async with self.redis.pipeline(transaction=False) as pipe:
            for model in names:
                pipe.hmget(self.keys.routes(model), ["doc", "version"])
            replies = await pipe.execute()
        return {
            model: Routes.of(loads(doc), int(version))
            for model, (doc, version) in zip(names, replies, strict=True)
            if doc is not None
        }

    async def served(self, config: ModelConfig) -> tuple[Routes, str | None]:
        """The routes producers serve `config` with, and why they differ from the stored ones
        (see served_routes); config.yaml's while none are stored."""
        stored = (await self.get_many([config.name])).get(config.name)
        return served_routes(stored, config) if stored else (seed_routes(config), None)

    async def version(self) -> int:
        """The global change counter: one cheap GET tells a producer whether to reload."""
        value = await self.redis.get(self.keys.routes_version)
        return int(value) if value is not None else 0

    async def history(self, model: str, limit: int = 50) -> list[RouteChange]:
        """The latest `limit` changes, newest last."""
        if limit <= 0:
            return []
        rows = await self.redis.lrange(self.keys.routes_log(model), -limit, -1)
        changes = []
        for row in rows:
            item = loads(as_text(row))
            changes.append(
                RouteChange(item["version"], item["at"], item["by"], item["old"], item["new"])
            )
        return changes

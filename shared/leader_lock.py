"""A lease in Redis that makes one process the leader of some background work: taken with
SET NX PX, renewed only by its holder (Lua), lost when the holder stops renewing, so another
process takes over within one lease after the leader dies, or at once after it stops in order
(`release`)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

# KEYS[1]=lock; ARGV: owner, lease ms. 1 if `owner` holds the lease now.
_HOLD = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
# KEYS[1]=lock; ARGV: owner. Deletes the lease only if `owner` holds it (another may by now).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class _Lease:
    """Which lease, whose, for how long: what `_HOLD` is called with, on either client."""

    def __init__(self, key: str, owner: str, lease_ms: int) -> None:
        self.key = key
        self.owner = owner
        self.lease_ms = lease_ms

    @property
    def _args(self) -> list[str | int]:
        return [self.owner, self.lease_ms]


class LeaderLock(_Lease):
    def __init__(self, client: aioredis.Redis, key: str, owner: str, lease_ms: int) -> None:
        super().__init__(key, owner, lease_ms)
        self._hold = client.register_script(_HOLD)
        self._release = client.register_script(_RELEASE)

    async def hold(self) -> bool:
        """Take or renew the lease; True while this process leads."""
        return bool(await self._hold(keys=[self.key], args=self._args))

    async def release(self) -> None:
        """Give the lease up if held: the next leader need not wait out a lease."""
        await self._release(keys=[self.key], args=[self.owner])


class BlockingLeaderLock(_Lease):
    """`LeaderLock` on a blocking client, for a process that polls with one (`conveyor
    autoscale`)."""

    def __init__(self, client: redis.Redis, key: str, owner: str, lease_ms: int) -> None:
        super().__init__(key, owner, lease_ms)
        self._hold = client.register_script(_HOLD)
        self._release = client.register_script(_RELEASE)

    def hold(self) -> bool:
        """Take or renew the lease; True while this process leads."""
        return bool(self._hold(keys=[self.key], args=self._args))

    def release(self) -> None:
        """Give the lease up if held: the next leader need not wait out a lease."""
        self._release(keys=[self.key], args=[self.owner])

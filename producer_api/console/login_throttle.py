"""Failed console logins per client address. The login form answered every guess at once, as
often as it was posted, each costing an HGETALL: a short chosen key (CONVEYOR_DEV_API_KEY takes
8 characters) could be searched for from one machine. Counted in Redis, so every producer
replica and process shares an address's count, in a fixed window of WINDOW_S from its first
attempt."""

from __future__ import annotations

import ipaddress

import redis.asyncio as aioredis

from shared.keys import Keys

WINDOW_S = 60


def bucket_of(host: str | None) -> str:
    """Whom a login is counted against: an IPv4 address, an IPv6 address's /64 (what one
    machine is given to draw addresses from), or one shared bucket for what is no address (no
    client text reaches a key name). An IPv4 client of a dual-stack socket (`--host ::`) is
    seen as `::ffff:a.b.c.d`: it counts as its IPv4 address (the /64 `::` made every IPv4
    client one bucket, which one guesser locked out)."""
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return "unknown"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False).network_address)
    return str(address)


class LoginThrottle:
    def __init__(self, client: aioredis.Redis, keys: Keys, limit: int) -> None:
        self.redis = client
        self.keys = keys
        self.limit = limit  # failed logins a bucket may make per window

    async def attempt(self, bucket: str) -> int:
        """Counts a login before its key is looked at, so that guesses sent at once cannot all
        pass a look taken before any was counted: the seconds until `bucket` may try again
        once past the limit, else 0."""
        key = self.keys.console_login_failures(bucket)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, WINDOW_S, nx=True)
            pipe.ttl(key)
            count, _, ttl = await pipe.execute()
        return max(int(ttl), 1) if int(count) > self.limit else 0

    async def forgive(self, bucket: str) -> None:
        """Takes back a login whose key was found: no guess, so an office behind one address
        logs in as often as it likes. The expiry is set again in case the window lapsed."""
        key = self.keys.console_login_failures(bucket)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.decr(key)
            pipe.expire(key, WINDOW_S, nx=True)
            await pipe.execute()

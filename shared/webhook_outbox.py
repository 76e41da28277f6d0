"""A lane's webhooks-owed set (`Keys.webhooks_owed`), the one owner of its client-side commands.

A job with a webhook ends owing its event: the script that ends it (FINISH, RECLAIM's dead
letter, the API's cancel through TRANSITION) adds its id, scored by the ms it ended
(shared/job_scripts.py, `owe`), in the same step as the end. Whoever hands the event to the
broker then settles it (the writer, the reclaimer, the producer's cancel), and the reclaimer
re-sends what stays overdue: its sender died in between (docs/architecture.md, "Webhooks").
Errors are raised: each caller decides what an event left owed costs it."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import Any

from shared.codec import as_text
from shared.job_store import now_ms
from shared.keys import Keys
from shared.redis_client import RedisClient, call_script

# The lane's overdue ids (KEYS[1], score <= ARGV[1], at most ARGV[2], oldest first) that no other
# reader holds, each then leased to reader ARGV[3] (KEYS[2], `Keys.webhook_leases`, in the owed
# set's slot) for ARGV[4] ms; a reader's own leases it takes again (its pass that failed to hand
# one over sends it again). A lease's end is stamped and judged on Redis's clock: judged by each
# reader's own, one whose clock ran a lease ahead of the holder's took every event it held at
# once, and both sent them.
_TAKE_OVERDUE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease_ms = tonumber(ARGV[4])
local taken = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])) do
  local holder, till = string.match(redis.call('HGET', KEYS[2], id) or '', '^(%S+) (%d+)$')
  if holder == nil or holder == ARGV[3] or tonumber(till) < now then
    redis.call('HSET', KEYS[2], id, ARGV[3] .. ' ' .. string.format('%.0f', now + lease_ms))
    taken[#taken + 1] = id
  end
end
if #taken > 0 then redis.call('PEXPIRE', KEYS[2], lease_ms) end
return taken
"""


class WebhookOutbox:
    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self.reader = uuid.uuid4().hex  # whose leases `overdue` takes
        self._take_overdue = client.register_script(_TAKE_OVERDUE)

    async def settle(self, stream: str, job_ids: Collection[str]) -> None:
        """Take jobs whose events the broker has off the lane's owed set, and their leases, in
        one round trip (none for no ids: a micro-batch without webhooks costs nothing)."""
        if job_ids:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrem(self.keys.webhooks_owed(stream), *job_ids)
                pipe.hdel(self.keys.webhook_leases(stream), *job_ids)
                await pipe.execute()

    async def overdue(self, stream: str, ended_by_ms: int, limit: int) -> list[str]:
        """Ids of the lane's jobs owed since `ended_by_ms` (epoch ms) or before, oldest first,
        at most `limit`, that no other reader holds; each is then this reader's for as long as
        the caller waits before calling an event overdue (now less `ended_by_ms`). Two workers'
        reclaimers both read every overdue id and both sent it: each event went out twice. A
        reader that dies before settling one leaves it to another once that lease lapses. Now
        is read on Redis's clock, as `ended_by_ms` was (`now_ms`): off the raw host clock, a host
        30 s behind Redis leased each event for 1 ms, not the timeout, and two readers sent it."""
        keys = [self.keys.webhooks_owed(stream), self.keys.webhook_leases(stream)]
        lease_ms = max(1, now_ms() - ended_by_ms)
        args = [ended_by_ms, limit, self.reader, lease_ms]
        owed: list[Any] = await call_script(self._take_overdue, keys, args)
        return [as_text(job_id) for job_id in owed]

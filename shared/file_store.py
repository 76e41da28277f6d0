"""Files uploaded for the Batch API (OpenAI's `/v1/files`, purpose `batch`): a hash per file,
its bytes beside its name, size and owner, in the file's own slot, kept until the `expires_at`
its upload set (the result TTL at most); its tenant lists it (TenantIndexed) and holds its
bytes against a budget (`CONVEYOR_MAX_FILE_BYTES_PER_TENANT`), so no tenant's uploads fill
Redis."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from typing import NamedTuple

import redis.asyncio as aioredis
from redis.typing import EncodableT

from shared.codec import as_text
from shared.file_expiry import file_expiry
from shared.job_store import now_ms
from shared.keys import Keys
from shared.redis_client import call_script, executed
from shared.tenant_index import TenantIndexed

FIELDS = ("tenant", "filename", "purpose", "bytes", "created_at", "expires_at")
# Bytes a file is charged against its tenant's budget beside its content and its name: its keys
# and entries (its hash's fields, its index, budget and expiry entries, its id unlisted once
# deleted), so a loop of tiny files is held to the budget too.
FILE_OVERHEAD_BYTES = 512


def charged(filename: str, size: int) -> int:
    """What a file of `size` bytes named `filename` holds of its tenant's budget."""
    return size + len(filename.encode()) + FILE_OVERHEAD_BYTES


# KEYS[1]=a tenant's held files (hash: file id -> its bytes, `total` their sum), KEYS[2]=when each
# expires (sorted set, ms), both in the tenant index's slot; ARGV: now (ms), file id, its bytes,
# its expiry (ms), the budget, the keys' TTL (s). Files past their expiry leave the sum first
# (each once, so a call costs what expired since the last); a file the budget cannot take is
# refused. A file held already is a rerun (the client sends a script again when its reply was
# lost): held once, not charged twice and not refused as over budget by its own first run.
# Returns {1 if held else 0, the bytes held after}.
HOLD = """
local now = tonumber(ARGV[1])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  redis.call('HINCRBY', KEYS[1], 'total', -tonumber(redis.call('HGET', KEYS[1], gone) or '0'))
  redis.call('HDEL', KEYS[1], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local held, size = tonumber(redis.call('HGET', KEYS[1], 'total') or '0'), tonumber(ARGV[3])
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then return {1, held} end
if held + size > tonumber(ARGV[5]) then return {0, held} end
redis.call('HSET', KEYS[1], ARGV[2], size)
redis.call('HINCRBY', KEYS[1], 'total', size)
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[6])
return {1, held + size}
"""

# KEYS as HOLD's; ARGV: a deleted file's id. Gives its bytes back once, however many deletes.
RELEASE = """
local size = redis.call('HGET', KEYS[1], ARGV[1])
if not size then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'total', -tonumber(size))
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""


class OverBudget(Exception):
    """The tenant's files already hold too much for this one."""

    def __init__(self, held: int, size: int, budget: int) -> None:
        super().__init__(f"{held} bytes held, {size} more asked, budget {budget}")
        self.held, self.size, self.budget = held, size, budget


class StoredFile(NamedTuple):
    """An uploaded file as its content is read: its owner, and its name for the download."""

    tenant: str
    filename: str
    data: bytes


class FileStore(TenantIndexed):
    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._hold = client.register_script(HOLD)
        self._release = client.register_script(RELEASE)

    def index_of(self, tenant: str) -> str:
        return self.keys.files_of(tenant)

    def unlisted_of(self, tenant: str) -> str:
        return self.keys.files_unlisted_of(tenant)

    @property
    def listed_for_s(self) -> int:
        return self.ttl_s

    def _held_of(self, tenant: str) -> list[str]:
        return list(self.keys.file_budget_of(tenant))

    def expires_at(self, created_at: int | None = None, asked_s: int | None = None) -> int:
        """When a file created at `created_at` (s; default now) expires (`file_expiry`)."""
        since = now_ms() // 1000 if created_at is None else created_at
        return file_expiry(since, asked_s, self.ttl_s)

    async def hold(
        self, tenant: str, file_id: str, size: int, budget: int, expires_at: int | None = None
    ) -> None:
        """Hold a file's `size` bytes against its tenant's `budget` until it expires (s;
        default a result TTL from now), OverBudget when they do not fit, before `put` stores
        it: the two are in different slots, so a put that fails (or a hold whose reply was
        lost) gives its hold back by `discard`, and one whose discard fails too leaves the hold
        until the file would have expired, erring on the side of the budget."""
        until = expires_at or self.expires_at()
        args = [now_ms(), file_id, size, until * 1000, budget, self.ttl_s]
        held, after = await call_script(self._hold, self._held_of(tenant), args)
        if not held:
            raise OverBudget(int(after), size, budget)

    async def put(
        self, file_id: str, fields: Mapping[str, str], data: bytes, expires_at: int | None = None
    ) -> None:
        """Store the file until `expires_at` (s; default a result TTL from now): the moment its
        file object gives, not one a round trip later."""
        key = self.keys.file(file_id)
        items: list[EncodableT] = [*chain.from_iterable(fields.items()), "data", data]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, items=items)
            pipe.expireat(key, expires_at or self.expires_at())
            await pipe.execute()
        await self.enlist(fields["tenant"], file_id)

    async def discard(self, tenant: str, file_id: str) -> None:
        """Undo an upload whose `hold` or `put` failed part-way or timed out (its client got no
        id, so nobody could delete it): its key if it was written, then its hold. Kept, the hold
        refused the client's retry as over budget, with no file to delete, for up to a result
        TTL. An index entry left behind is dropped by the next listing, as an expired file's."""
        await self.redis.delete(self.keys.file(file_id))
        await call_script(self._release, self._held_of(tenant), [file_id])

    async def fields_many(self, file_ids: list[str]) -> list[dict[str, str] | None]:
        """Each file's `FIELDS`, without its bytes (None: no such file), in one round trip (a
        cluster pipeline is split per node)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for file_id in file_ids:
                pipe.hmget(self.keys.file(file_id), FIELDS)
            rows = await executed(pipe)
        return [
            None
            if values[0] is None
            else {name: as_text(value) for name, value in zip(FIELDS, values, strict=True) if value}
            for values in rows
        ]

    async def data(self, file_id: str) -> StoredFile | None:
        """The file with its owner and name; None when there is no such file."""
        fields = ("tenant", "filename", "data")
        tenant, filename, data = await self.redis.hmget(self.keys.file(file_id), fields)
        if tenant is None or data is None:
            return None
        content = data if isinstance(data, bytes) else data.encode()
        return StoredFile(as_text(tenant), as_text(filename or ""), content)

    async def delete(self, file_id: str) -> bool:
        """Drop the file, give its bytes back to its tenant's budget and unlist it (once: the
        owner read in the transaction that drops it); whether this call dropped it, so of
        concurrent deletes only one says so. Left listed, a loop of uploads and deletes grew
        the index without bound, every entry a lookup for the next listing; a page after the
        deleted id still goes on from its place (LISTED)."""
        key = self.keys.file(file_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hget(key, "tenant")
            pipe.delete(key)
            tenant, _ = await pipe.execute()
        if tenant is None:
            return False
        await self.forget(as_text(tenant), file_id)  # it was there, and this transaction dropped it
        return True

    async def forget(self, tenant: str, file_id: str) -> None:
        """Give a deleted file's bytes back to its tenant's budget and unlist it, once however
        many calls (RELEASE, UNLIST): also after a delete that found the file gone, which may
        have been its own first run, sent again by the client when its reply was lost; then
        nothing gave the bytes back until the file would have expired."""
        await call_script(self._release, self._held_of(tenant), [file_id])
        await self.unlist(tenant, [file_id])

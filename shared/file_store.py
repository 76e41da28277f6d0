"""Files uploaded for the Batch API (OpenAI's `/v1/files`, purpose `batch`): a hash per file,
its bytes beside its name, size and owner, in the file's own slot, kept as long as a batch's
results are (the result TTL); its tenant lists it (TenantIndexed)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain

import redis.asyncio as aioredis
from redis.typing import EncodableT

from shared.codec import as_text
from shared.keys import Keys
from shared.redis_client import executed
from shared.tenant_index import TenantIndexed

FIELDS = ("tenant", "filename", "purpose", "bytes", "created_at")


class FileStore(TenantIndexed):
    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s

    def index_of(self, tenant: str) -> str:
        return self.keys.files_of(tenant)

    def unlisted_of(self, tenant: str) -> str:
        return self.keys.files_unlisted_of(tenant)

    @property
    def listed_for_s(self) -> int:
        return self.ttl_s

    async def put(self, file_id: str, fields: Mapping[str, str], data: bytes) -> None:
        key = self.keys.file(file_id)
        items: list[EncodableT] = [*chain.from_iterable(fields.items()), "data", data]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, items=items)
            pipe.expire(key, self.ttl_s)
            await pipe.execute()
        await self.enlist(fields["tenant"], file_id)

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

    async def data(self, file_id: str) -> tuple[str, bytes] | None:
        """(its owner, its bytes); None when there is no such file."""
        tenant, data = await self.redis.hmget(self.keys.file(file_id), ("tenant", "data"))
        if tenant is None or data is None:
            return None
        return as_text(tenant), data if isinstance(data, bytes) else data.encode()

    async def delete(self, file_id: str) -> None:
        """The file's index entry stays until a page finds it gone (`page` drops it then): a
        client that deletes what it lists, then asks for the page after the last id it saw,
        got an empty last page, the deleted id having no place left to list after."""
        await self.redis.delete(self.keys.file(file_id))

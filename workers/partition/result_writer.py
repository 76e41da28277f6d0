"""Write-back for a whole micro-batch in one round trip: results, replies, XACK and XDEL happen
in one Lua script, so a result is visible if and only if its entry is acknowledged."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import as_text, dumps
from shared.job_store import job_view
from shared.keys import GROUP, Keys


@dataclass(slots=True)
class Finish:
    """One entry's fate: `status` '' only acknowledges it (already terminal, cancelled, gone)."""

    entry_id: bytes
    job_id: str = ""
    reply: str = ""
    status: str = ""
    fields: dict[str, str] = field(default_factory=dict)
    context: Mapping[str, str] = field(default_factory=dict)
    webhook: str = ""

    def view(self) -> dict[str, Any]:
        return job_view(self.job_id, {**self.context, **self.fields, "status": self.status})

    def message(self) -> bytes:
        """The reply published to the waiting producer: the job's public view."""
        return dumps(self.view()) if self.status else b""


class ResultWriter:
    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.keys = keys
        self.ttl_s = ttl_s
        self._finish = client.register_script(job_scripts.FINISH)

    async def finish(self, stream: str, batch: list[Finish]) -> list[Finish]:
        """Write and acknowledge the batch; returns the finishes whose results were written (the
        rest were acknowledged only: already terminal, cancelled, or gone)."""
        if not batch:
            return []
        args: list[str | bytes | int] = [GROUP, self.ttl_s, self.keys.job_prefix]
        drained = self.keys.drained(stream, int(time.time()))
        for item in batch:
            args += [item.entry_id, item.job_id, item.reply, item.message(), item.status]
            args.append(len(item.fields))
            for name, value in item.fields.items():
                args += [name, value]
        written = {
            as_text(job_id) for job_id in await self._finish(keys=[stream, drained], args=args)
        }
        return [item for item in batch if item.job_id in written]

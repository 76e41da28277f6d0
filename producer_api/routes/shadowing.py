"""Shadow traffic on the producer. `ShadowCopies` copies a sampled share of online requests to
each shadow variant's bulk lane in the background (the client's request never waits for it, a
full lane drops the copy); the copy belongs to a tenant no API key can have, has no reply
channel and no webhook, so its result never reaches the client. `ShadowComparisons` compares
finished pairs (run by the traffic leader) and adds the outcome to the shadow's counters."""

from __future__ import annotations

import asyncio
import logging
import random

from redis.exceptions import RedisError

from shared.codec import RequestEntry
from shared.job_store import JobRecord, JobStore, QueueFull, now_ms, stamp_ms
from shared.keys import Keys, new_job_id
from shared.metrics import SHADOW_COPIES
from shared.model_repository import ModelConfig, ModelRepository
from shared.routing import Routes
from shared.shadow_compare import compare
from shared.shadow_pairs import ShadowPair, ShadowPairs
from shared.variant_stats import VariantStats

log = logging.getLogger(__name__)

# Not a valid tenant name (shared/api_keys.TENANT), so no API key can read a shadow job.
SHADOW_TENANT = "~shadow"
PAIRS_PER_LOOK = 256
MAX_PAIR_AGE_MS = 15 * 60 * 1000


class ShadowCopies:
    def __init__(self, job_store: JobStore, pairs: ShadowPairs, keys: Keys) -> None:
        self.job_store = job_store
        self.pairs = pairs
        self.keys = keys
        self._tasks: set[asyncio.Task[None]] = set()

    def copy(self, config: ModelConfig, routes: Routes, entry: RequestEntry, variant: str) -> None:
        """Start the sampled copies of one accepted online request; returns at once."""
        for shadow, rate in routes.shadows.items():
            if rate > 0 and random.random() < rate:
                task = asyncio.create_task(self._enqueue(config, shadow, entry, variant))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _enqueue(
        self, config: ModelConfig, shadow: str, entry: RequestEntry, variant: str
    ) -> None:
        copy = RequestEntry(
            job_id=new_job_id(config.name, shadow),
            payload={k: v for k, v in entry.payload.items() if k != "webhook"},
            enqueued_ms=stamp_ms(),
            deadline_ms=entry.deadline_ms,
            tenant=SHADOW_TENANT,
            traceparent=entry.traceparent,
        )
        stream = self.keys.bulk_queue(config.name, shadow)
        fields: dict[str, str | int] = {
            "model": config.name,
            "variant": shadow,
            "deadline": copy.deadline_ms,
            "shadow_of": entry.job_id,
        }
        try:
            limit, fair = config.queue.max_length, (config.fair_window_of(shadow), 1.0)
            await self.job_store.create(copy, stream, fields, limit, fair=fair)
            pair = ShadowPair(entry.job_id, copy.job_id, variant, shadow)
            await self.pairs.add(config.name, pair)
        except (QueueFull, RedisError) as exc:
            SHADOW_COPIES.labels(config.name, shadow, "dropped").inc()
            log.info("shadow copy of %s dropped: %r", entry.job_id, exc)
            return
        SHADOW_COPIES.labels(config.name, shadow, "enqueued").inc()

    async def stop(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)


class ShadowComparisons:
    def __init__(
        self,
        pairs: ShadowPairs,
        jobs: JobStore,
        stats: VariantStats,
        repository: ModelRepository,
    ) -> None:
        self.pairs = pairs
        self.jobs = jobs
        self.stats = stats
        self.repository = repository

    async def look(self) -> None:
        for config in self.repository:
            await self.settle(config.name)

    async def settle(self, model: str) -> None:
        """Compare every pending pair whose two jobs ended; drop pairs too old to finish."""
        pending = await self.pairs.pending(model, PAIRS_PER_LOOK)
        if not pending:
            return
        ids = [job_id for pair, _ in pending for job_id in (pair.primary_id, pair.shadow_id)]
        records = await self.jobs.get_many(ids)
        both = zip(records[::2], records[1::2], strict=True)
        oldest = now_ms() - MAX_PAIR_AGE_MS
        for (pair, at_ms), (primary, shadow) in zip(pending, both, strict=True):
            if primary is None or shadow is None:
                await self.pairs.take(model, pair)  # a side vanished
            elif primary.status.terminal and shadow.status.terminal:
                await self._compare(model, pair, primary, shadow)
            elif at_ms < oldest:
                await self.pairs.take(model, pair)

    async def _compare(
        self, model: str, pair: ShadowPair, primary: JobRecord, shadow: JobRecord
    ) -> None:
        """Count the comparison once, by whoever removes the pair (one with nothing to compare,
        one of them never having run, is only removed). Removed first: a pair whose comparison
        raised stayed first in line, and no pair after it was compared again."""
        if not await self.pairs.take(model, pair):
            return
        comparison = compare(primary.view(), shadow.view())
        if comparison is None:
            return
        await self.stats.add_counts(model, pair.shadow_variant, comparison.counts())
        fields = {"primary_variant": pair.primary_variant, **comparison.fields()}
        await self.pairs.store(pair, {"shadow_variant": pair.shadow_variant, **fields})

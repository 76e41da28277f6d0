"""Shadow traffic on the producer. `ShadowCopies` copies a sampled share of online requests to
each shadow variant's bulk lane in the background (the client's request never waits for it; a
full lane, or MAX_COPIES_IN_FLIGHT copies under way, drops the copy); the copy belongs to a
tenant no API key can have, has no reply channel and no webhook, so its result never reaches
the client. `ShadowComparisons` compares finished pairs (run by the traffic leader) and adds
the outcome to the shadow's counters."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections import defaultdict
from collections.abc import Iterable

from redis.exceptions import RedisError

from shared.codec import RequestEntry
from shared.job_parameters import ParametersRefused, check_parameters
from shared.job_store import JobRecord, JobStore, QueueFull, now_ms, stamp_ms
from shared.keys import Keys, new_job_id
from shared.metrics import SHADOW_COPIES, SHADOW_PAIRS_DROPPED
from shared.model_repository import ModelConfig, ModelRepository, QueueLimits
from shared.routing import Routes
from shared.shadow_compare import RAN, compare
from shared.shadow_pairs import ShadowPair, ShadowPairs, Totals
from shared.variant_stats import SHADOW_TENANT, VariantStats

log = logging.getLogger(__name__)

PAIRS_PER_PAGE = 256
# A pair still running this long after its submit is dropped uncompared (counted in
# conveyor_shadow_pairs_dropped_total): past a queue's default max_queue_time_s (10 min), its
# copy waits in a bulk lane that cannot keep up. A model whose jobs may wait longer keeps its
# pairs that much longer (ShadowComparisons._max_age_ms).
MAX_PAIR_AGE_MS = 15 * 60 * 1000
DEFAULT_QUEUE_TIME_S: float = QueueLimits.model_fields["max_queue_time_s"].default
# Copies a producer has in flight at once: each takes two round trips (~1 ms), so the bound
# only bites while Redis is slow, when the tasks piled up without end, each holding its
# request's payload and a connection of the producer's pool (64) that requests wait for. Half
# that pool: the copies never hold every connection.
MAX_COPIES_IN_FLIGHT = 32
# a pair whose two jobs ended, with their records
Ended = tuple[ShadowPair, JobRecord, JobRecord]


class ShadowCopies:
    def __init__(
        self,
        job_store: JobStore,
        pairs: ShadowPairs,
        keys: Keys,
        max_in_flight: int = MAX_COPIES_IN_FLIGHT,
    ) -> None:
        self.job_store = job_store
        self.pairs = pairs
        self.keys = keys
        self.max_in_flight = max_in_flight
        self._tasks: set[asyncio.Task[None]] = set()

    def copy(self, config: ModelConfig, routes: Routes, entry: RequestEntry, variant: str) -> None:
        """Start the sampled copies of one accepted online request; returns at once. None to
        the variant it runs on (a client named a shadow): that was a second job of the same
        variant, and a pair of it with itself, pushing its agreement toward 100 %. One past
        `max_in_flight` copies is dropped and counted (`busy`), never waited for; so is one whose
        parameters the shadow refuses (`refused`: its own `max_tokens_limit` or backend), as a
        submit to it would be: a copy bypassed them, its answer cut or run past its limit."""
        for shadow, rate in routes.shadows.items():
            if shadow != variant and rate > 0 and random.random() < rate:
                if len(self._tasks) >= self.max_in_flight:
                    SHADOW_COPIES.labels(config.name, shadow, "busy").inc()
                    continue
                if _refuses(config, shadow, entry):
                    SHADOW_COPIES.labels(config.name, shadow, "refused").inc()
                    continue
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
            tenant=SHADOW_TENANT,  # no API key's: none can read the copy
            traceparent=entry.traceparent,
            tracestate=entry.tracestate,
        )
        stream = self.keys.bulk_queue(config.name, shadow)
        fields: dict[str, str | int] = {
            "model": config.name,
            "variant": shadow,
            "shadow_of": entry.job_id,
        }
        pair = ShadowPair(entry.job_id, copy.job_id, variant, shadow)
        try:
            await self.pairs.add(config.name, pair)
            limit, fair = config.queue.max_length, (config.fair_window_of(shadow), 1.0)
            await self.job_store.create(copy, stream, fields, limit, fair=fair)
        except (QueueFull, RedisError) as exc:
            await self._dropped(config, pair, exc, unpair=isinstance(exc, QueueFull))
            return
        SHADOW_COPIES.labels(config.name, shadow, "enqueued").inc()

    async def _dropped(
        self, config: ModelConfig, pair: ShadowPair, exc: Exception, unpair: bool
    ) -> None:
        """Count a copy not enqueued. The pair is recorded before the copy, so a Redis error
        between the two leaves a pair without its copy (dropped `vanished` by a later look)
        rather than a copy that runs unpaired; a refused copy's pair is forgotten at once. A
        pair left by a Redis error is kept: the copy may have been written all the same."""
        SHADOW_COPIES.labels(config.name, pair.shadow_variant, "dropped").inc()
        log.info("shadow copy of %s dropped: %r", pair.primary_id, exc)
        if unpair:
            with contextlib.suppress(RedisError):  # left for a later look to drop
                await self.pairs.remove(config.name, pair)

    async def stop(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _refuses(config: ModelConfig, shadow: str, entry: RequestEntry) -> bool:
    """Whether `shadow`'s submit would refuse the request's parameters (the primary's took
    them; a generate model's variants may set other limits or backends)."""
    try:
        check_parameters(config, shadow, entry.payload.get("parameters") or {})
    except ParametersRefused:
        return True
    return False


class ShadowComparisons:
    def __init__(
        self,
        pairs: ShadowPairs,
        jobs: JobStore,
        stats: VariantStats,
        repository: ModelRepository,
        budget_s: float,
    ) -> None:
        self.pairs = pairs
        self.jobs = jobs
        self.stats = stats
        self.repository = repository
        self.budget_s = budget_s
        self._starts: dict[str, int] = {}  # per model, the rank the next look starts at

    async def look(self) -> None:
        """Settle pages of every model's pending pairs, one page per model in turn, until no
        model's page settles anything or `budget_s` is spent (every model gets one page). One
        page a look held settling under ~500 pairs a second: past that, pairs piled up until
        their jobs' hashes expired. The next look goes on where this one stopped, back at the
        first page after the last: begun at the first each time, a page of pairs still waiting
        (a down shadow's) held up every pair behind it for MAX_PAIR_AGE_MS. A model whose page
        Redis refuses (on a cluster, its jobs' master failing over) is left for this look, and
        the refusal raised once the others are settled: raised at once, it held them all up."""
        deadline = time.monotonic() + self.budget_s
        starts = {config.name: self._starts.get(config.name, 0) for config in self.repository}
        refused: list[RedisError] = []
        while starts:
            for model, start in list(starts.items()):
                after = await self._page(model, start, refused)
                if after is None:
                    del starts[model]
                else:
                    starts[model] = after
            if time.monotonic() >= deadline:
                break
        if refused:
            raise refused[0]

    async def _page(self, model: str, start: int, refused: list[RedisError]) -> int | None:
        """Settle `model`'s page at rank `start` and note where its next look starts. The rank
        of the page this look reads next, None when it reads no more of the model's: the page
        settled nothing, was the last, or Redis refused it (the error added to `refused`)."""
        try:
            after, settled = await self.settle(model, start)
        except RedisError as exc:
            refused.append(exc)
            return None
        self._starts[model] = after or 0
        return after if settled else None

    async def settle(self, model: str, start: int) -> tuple[int | None, bool]:
        """Settle one page of pending pairs, from rank `start`: compare those whose two jobs
        ended, drop those with a side vanished or too old to finish. The rank the next page
        starts at (past the pairs left waiting; None after the last page), and whether this
        page settled any pair. A few round trips a page, not three a pair."""
        page = await self.pairs.pending(model, PAIRS_PER_PAGE, start)
        ended, dropped = await self._sort(page, now_ms() - self._max_age_ms(model))
        drop = [pair for pair, _ in dropped]
        taken, gone = await self.pairs.take(model, [pair for pair, _, _ in ended], drop=drop)
        for (pair, reason), ours in zip(dropped, gone, strict=True):
            if ours:  # counted by the one look that dropped it
                SHADOW_PAIRS_DROPPED.labels(model, pair.shadow_variant, reason).inc()
        won = [both for both, ours in zip(ended, taken, strict=True) if ours]
        await self._count(model, won)
        waiting = len(page) - len(ended) - len(dropped)
        after = None if len(page) < PAIRS_PER_PAGE else start + waiting
        return after, waiting < len(page)

    def _max_age_ms(self, model: str) -> float:
        """MAX_PAIR_AGE_MS, plus however much longer than the default the model's copies may
        wait in their lane: with `max_queue_time_s: 1800` a copy still queued at 15 minutes may
        run at 29, and its pair was dropped before."""
        config = self.repository.get(model)
        longer_s = config.queue.max_queue_time_s - DEFAULT_QUEUE_TIME_S if config else 0.0
        return MAX_PAIR_AGE_MS + max(0.0, longer_s) * 1000

    async def _sort(
        self, page: list[tuple[ShadowPair, int]], oldest: float
    ) -> tuple[list[Ended], list[tuple[ShadowPair, str]]]:
        """The page's pairs whose two jobs ended (with their records), and those to drop with
        why: `vanished` at once if the primary's hash is gone (it is written before its pair:
        it expired), else once submitted before `oldest` if the copy's is (the copy is written
        after its pair: young, it may be yet); `unran` at once if either job ended without
        running (cancelled or expired: `compare` has nothing to compare, and the pair was read
        again every look until the other ended, only to be released); or `too_old`, still
        running. The rest wait."""
        ids = [job_id for pair, _ in page for job_id in (pair.primary_id, pair.shadow_id)]
        records = await self.jobs.get_many(ids)
        both = zip(records[::2], records[1::2], strict=True)
        ended: list[Ended] = []
        dropped: list[tuple[ShadowPair, str]] = []
        for (pair, at_ms), (primary, shadow) in zip(page, both, strict=True):
            if primary is None or shadow is None:
                if primary is None or at_ms < oldest:  # a younger pair's copy may be written yet
                    dropped.append((pair, "vanished"))
            elif _unran(primary) or _unran(shadow):
                dropped.append((pair, "unran"))
            elif primary.status.terminal and shadow.status.terminal:
                ended.append((pair, primary, shadow))
            elif at_ms < oldest:
                dropped.append((pair, "too_old"))
        return ended, dropped

    async def _count(self, model: str, won: list[Ended]) -> None:
        """Settle the pairs this look claimed: compare those never compared (one with nothing
        to compare, one of them never having run, is only released), store their results with
        their page's counts summed per shadow variant, add those counts (one script call per
        variant) and any a failed page before left unadded, then release the claims (see
        shared/shadow_pairs.py). Claimed before comparing: a pair whose comparison raised
        stayed first in line, and no pair after it was compared again. Results stored before
        counting: a page that failed after counting was counted again by a later look. Compared
        in a thread: a page of minilm pairs held the API's loop (every reply) for seconds."""
        if not won:
            return
        claimed = [pair for pair, _, _ in won]
        before, pages = await self.pairs.compared(claimed)
        fresh_pairs = [both for both in won if both[0] not in before]
        totals, results = await asyncio.to_thread(_compared, fresh_pairs)
        if results:
            fresh = os.urandom(16).hex()
            await self.pairs.store(fresh, totals, results)
            pages[fresh] = totals
        keep_s = self.pairs.ttl_s
        await asyncio.gather(
            *(
                self.stats.add_counts_once(model, variant, counts, page, keep_s)
                for page, by_variant in pages.items()
                for variant, counts in by_variant.items()
            )
        )
        await self.pairs.done(model, claimed, pages)


def _unran(record: JobRecord) -> bool:
    """Whether the job ended without running to an answer (cancelled or expired)."""
    return record.status.terminal and record.status not in RAN


def _compared(ended: Iterable[Ended]) -> tuple[Totals, list[tuple[ShadowPair, dict[str, str]]]]:
    """The comparisons' counts summed per shadow variant, and each pair's comparison fields."""
    totals: Totals = defaultdict(lambda: defaultdict(float))
    results: list[tuple[ShadowPair, dict[str, str]]] = []
    for pair, primary, shadow in ended:
        comparison = compare(primary.view(), shadow.view())
        if comparison is None:
            continue
        for name, value in comparison.counts().items():
            totals[pair.shadow_variant][name] += value
        results.append((pair, comparison.fields()))
    return totals, results

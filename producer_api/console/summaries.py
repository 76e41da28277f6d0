"""What every open console shows live, computed once per second per producer process (not per
viewer): partition queue state, throughput and service-time percentiles, live workers and
Batch API progress. Viewers wait on the next snapshot in memory, so ten consoles cost Redis
exactly what one does."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import asdict
from typing import Any

import numpy as np

from producer_api.batch_api.progress import view as batch_view
from producer_api.periodic import Periodic
from producer_api.state import ProducerState
from shared.batch_api_store import ENDED_KEPT_MS, OUTPUT_EXPIRES_AFTER, BatchStatus
from shared.partition_stats import PartitionStats, read_partition_stats
from shared.redis_clock import CLOCK
from shared.stats_window import window_span_s
from shared.variant_stats import VariantStats, Window
from shared.worker_registry import WorkerRegistry

INTERVAL_S = 1.0
HISTORY = 120  # points per sparkline: two minutes of queue length, ten of throughput
STATS_EVERY = 5  # throughput/percentile windows are re-read every this many ticks
STATS_WINDOW_S = 60.0
MAX_BATCHES = 20
FIRST_WAIT_S = 3.0  # how long a page drawn in a producer's first moment waits for a summary
ENDED_BATCH_KEEP_S = ENDED_KEPT_MS / 1000  # as long as the ended index keeps them
_ENDED = {status.value for status in BatchStatus if status.terminal}


def _percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def _rates(window: Window, span_s: float) -> dict[str, Any]:
    service = [sample.service_ms for sample in window.samples]
    return {
        "rate_per_s": round(window.requests / span_s, 2),
        "errors": window.errors,
        "p50_ms": _percentile(service, 50),
        "p99_ms": _percentile(service, 99),
    }


def _files_while_kept(batch: dict[str, Any], now: float) -> dict[str, Any]:
    """`batch` as shown at `now`: no file ids once its files expired, so no page links them
    (a link answered 404). An ended batch is listed for ENDED_BATCH_KEEP_S, which a producer
    with a shorter result TTL (restarted with one, or a replica given one) keeps its files
    less than."""
    expires_at = batch["files_expire_at"]
    if expires_at is None or now < expires_at:
        return batch
    return {**batch, "output_file_id": None, "error_file_id": None}


class ConsoleSummaries:
    def __init__(self, state: ProducerState) -> None:
        self.state = state
        self.workers = WorkerRegistry(state.redis, state.keys)
        self.stats = VariantStats(state.redis, state.keys)
        self.snapshot: dict[str, Any] = {"at": 0.0, "partitions": [], "workers": [], "batches": []}
        self._history: dict[str, deque[int]] = {}
        self._throughput: dict[str, deque[float]] = {}
        self._rates: dict[str, dict[str, Any]] = {}
        self._shown: dict[str, dict[str, Any]] = {}  # each batch's view as last read, by id
        self._turn = 0  # where in the running batches the next look's refreshes begin
        self._ticks = 0
        self._changed = asyncio.Condition()
        self._loop = Periodic("console-summaries", INTERVAL_S, self.step)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def step(self) -> None:
        if self._ticks % STATS_EVERY == 0:
            await self._read_rates()
        self._ticks += 1
        partitions = await read_partition_stats(
            self.state.redis, self.state.keys, self.state.repository
        )
        workers = await self.workers.live()
        batches = await self._batches()
        at = CLOCK.now()  # Redis's clock, as the workers' beats and the batches' ends are
        snapshot = {
            "at": at,
            "partitions": [self._partition(p) for p in partitions],
            "workers": [asdict(beat) for beat in workers],
            "batches": [_files_while_kept(batch, at) for batch in batches],
        }
        async with self._changed:
            self.snapshot = snapshot
            self._changed.notify_all()

    async def current(self, wait_s: float = FIRST_WAIT_S) -> dict[str, Any]:
        """The latest snapshot; before the first is published (a producer just started), the
        first, waited for up to `wait_s`. A page drawn from the empty placeholder had no
        partition rows, which its script updates but never adds: the Overview stayed empty
        until reloaded."""
        if not self.snapshot["at"]:
            async with self._changed:
                with suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._changed.wait_for(lambda: bool(self.snapshot["at"]))
        return self.snapshot

    async def follow(self) -> AsyncIterator[dict[str, Any]]:
        """The current snapshot (none before the first is published: the empty placeholder
        drew "No live workers" and no batches over a full page, the live dot green), then each
        new one as it is published."""
        if self.snapshot["at"]:
            yield self.snapshot
        while True:
            async with self._changed:
                await self._changed.wait()
                snapshot = self.snapshot
            yield snapshot

    def _partition(self, stats: PartitionStats) -> dict[str, Any]:
        name = f"{stats.model}:{stats.variant}"
        history = self._history.setdefault(name, deque(maxlen=HISTORY))
        history.append(stats.online.length + stats.bulk.length)
        empty = {"rate_per_s": 0.0, "errors": 0, "p50_ms": None, "p99_ms": None}
        return {
            "id": name,
            "model": stats.model,
            "variant": stats.variant,
            "online": asdict(stats.online),
            "bulk": asdict(stats.bulk),
            "dlq": stats.dlq_depth,
            "history": list(history),
            "throughput": list(self._throughput.get(name, ())),
            **self._rates.get(name, empty),
        }

    async def _read_rates(self) -> None:
        """Jobs per second and service-time p50/p99 over the last minute, per variant."""
        now = CLOCK.now()
        since = now - STATS_WINDOW_S
        for config in self.state.repository:
            windows = await self.stats.window(config.name, config.variants, since, now)
            span_s = window_span_s(since, now)
            for variant, window in windows.items():
                name = f"{config.name}:{variant}"
                self._rates[name] = _rates(window, span_s)
                points = self._throughput.setdefault(name, deque(maxlen=HISTORY))
                points.append(self._rates[name]["rate_per_s"])

    async def _batches(self) -> list[dict[str, Any]]:
        """Every running batch and every one that ended lately, each as last read: a look
        refreshes at most MAX_BATCHES running ones (those not shown yet first, then the next in
        turn) and those ended but not yet shown ended, so its cost is bounded however many run,
        and each running batch's turn comes round every len(active) / MAX_BATCHES looks."""
        store = self.state.batch_store
        active = [batch_id for batch_id, _ in await store.active()]
        # an ended batch is read until its final view is held: once more if it was shown
        # running, once if it ran and ended between two looks
        ended = await store.ended_since(int((CLOCK.now() - ENDED_BATCH_KEEP_S) * 1000))
        unfinal = [batch_id for batch_id in ended if not self._final(batch_id)]
        for batch_id in dict.fromkeys([*self._in_turn(active), *unfinal[-MAX_BATCHES:]]):
            progress = await self.state.batch_progress.refresh(batch_id, window=0)
            if progress is not None:
                body = batch_view(batch_id, progress, None)  # console.js links it itself
                body["tenant"] = progress.fields.get("tenant", "default")
                body["files_expire_at"] = self._files_expire_at(body, progress.fields)
                self._shown[batch_id] = body
        listed = {*active, *ended}
        self._shown = {batch_id: b for batch_id, b in self._shown.items() if batch_id in listed}
        return sorted(self._shown.values(), key=lambda body: -(body["created_at"] or 0))

    def _files_expire_at(self, body: dict[str, Any], fields: dict[str, str]) -> int | None:
        """When an ended batch's output and errors files go (s), as `GET /v1/batches/{id}/output`
        judges it: its `output_expires_after` from its end, the result TTL at most; None while
        it runs."""
        ended_at = body.get(f"{body['status']}_at")
        if body["status"] not in _ENDED or ended_at is None:
            return None
        asked = fields.get(OUTPUT_EXPIRES_AFTER)
        return self.state.file_store.expires_at(ended_at, int(asked) if asked else None)

    def _in_turn(self, active: list[str]) -> list[str]:
        """The running batches this look refreshes: those never shown, then from where the
        last look stopped, MAX_BATCHES in all."""
        if len(active) <= MAX_BATCHES:
            return active
        start = self._turn % len(active)
        self._turn = start + MAX_BATCHES
        unseen = [batch_id for batch_id in active if batch_id not in self._shown]
        rotated = active[start:] + active[:start]
        return list(dict.fromkeys([*unseen, *rotated]))[:MAX_BATCHES]

    def _final(self, batch_id: str) -> bool:
        held = self._shown.get(batch_id)
        return held is not None and held["status"] in _ENDED

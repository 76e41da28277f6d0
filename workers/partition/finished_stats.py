"""Variant statistics of the jobs a worker finishes (what canaries and experiments read), sent
at most once a second rather than once per micro-batch, so a micro-batch costs its read and its
write-back round trips only. A crash loses at most the last second's statistics, never a job."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping

from redis.exceptions import RedisError

from shared.variant_stats import Sample, Variant, VariantStats, finished_samples

log = logging.getLogger(__name__)
SEND_EVERY_S = 1.0


class FinishedStats:
    def __init__(self, stats: VariantStats, every_s: float = SEND_EVERY_S) -> None:
        self.stats = stats
        self.every_s = every_s
        self._samples: dict[Variant, list[Sample]] = defaultdict(list)
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def add(self, jobs: Iterable[Mapping[str, str]]) -> None:
        """Gather finished jobs (their hash fields); sent `every_s` after the first of them."""
        for variant, samples in finished_samples(jobs).items():
            self._samples[variant] += samples
        if self._samples and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.every_s, self._send_later)

    def _send_later(self) -> None:
        self._timer = None
        task = asyncio.create_task(self.send())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def send(self) -> None:
        """Record what was gathered; a Redis failure costs those statistics (logged) only."""
        samples, self._samples = self._samples, defaultdict(list)
        if not samples:
            return
        try:
            await self.stats.record_samples(samples)
        except RedisError as exc:
            jobs = sum(len(batch) for batch in samples.values())
            log.warning("variant statistics of %d finished jobs not recorded: %s", jobs, exc)

    async def close(self) -> None:
        """Send what is gathered now (the worker stops)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await asyncio.gather(*self._sending)
        await self.send()

"""Queue position and ETA of queued jobs, and the admission limit a deadline sets. Positions are
read per request (one O(1) script); each partition's drain rate and live workers are refreshed
once a second for the whole producer, so an estimate costs no Redis call of its own.

Method (docs/architecture.md): the partition's throughput over the last RATE_WINDOW_S seconds,
scaled by live workers now over the mean live workers then, is what drains a lane; a lane
shares it with the other lane when both have work (online 1/(1+bulk_share), bulk
bulk_share/(1+bulk_share), as workers alternate). ETA = entries ahead / lane rate: when the job
should start running. A window that drained nothing while workers serve (a pause) keeps the
last measured rate: the workers did not slow down, they had nothing to do."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields

import redis.asyncio as aioredis

from producer_api.periodic import Periodic
from shared.job_store import JobRecord
from shared.model_repository import ModelConfig, ModelRepository
from shared.queue_position import (
    RATE_WINDOW_S,
    PartitionLoad,
    QueuePositions,
    read_partition_loads,
)

REFRESH_S = 1.0
Partition = tuple[str, str]


@dataclass(frozen=True, slots=True)
class PerWorker:
    """A partition's last measured throughput per serving worker, by lane (entries/s)."""

    online: float
    bulk: float


@dataclass(frozen=True, slots=True)
class StartBy:
    """The latest a job may start and still run (Unix ms): its deadline, or sooner the end of
    the wait its queue allows (`max_queue_time_s`: a worker expires the job past it), a limit
    that moves with a retry as a `ttl_s` deadline does."""

    ms: int
    queue_time: bool

    @classmethod
    def of(cls, config: ModelConfig, enqueued_ms: float, deadline_ms: int) -> StartBy:
        waited_out = math.floor(enqueued_ms + config.queue.max_queue_time_s * 1000)
        if deadline_ms and deadline_ms <= waited_out:
            return cls(deadline_ms, queue_time=False)
        return cls(waited_out, queue_time=True)

    @property
    def what(self) -> str:
        return "the queue's max_queue_time_s" if self.queue_time else "its deadline"


@dataclass(frozen=True, slots=True)
class Standing:
    """Where a queued job stands: entries ahead in its lane and the ETA of its start (None
    while no rate is known, e.g. no worker serves the partition)."""

    queue_position: int
    eta_ms: int | None

    def public(self) -> dict[str, int | None]:
        return {"queue_position": self.queue_position, "eta_ms": self.eta_ms}


# What a queued job's view and 202 add (`Standing.public()`'s keys).
STANDING_FIELDS = tuple(field.name for field in dataclass_fields(Standing))


class QueueEta:
    def __init__(
        self, client: aioredis.Redis, positions: QueuePositions, repository: ModelRepository
    ) -> None:
        """`client` refreshes the loads; `positions` reads on the request path (group commit)."""
        self.client = client
        self.keys = positions.keys
        self.repository = repository
        self.positions = positions
        self.loads: dict[Partition, PartitionLoad] = {}
        self._serving: dict[Partition, deque[int]] = {}
        self._measured: dict[Partition, PerWorker] = {}
        self.refresher = Periodic("queue-eta", REFRESH_S, self.refresh)

    async def refresh(self) -> None:
        partitions = [(c.name, v) for c in self.repository for v in c.variants]
        self.loads = await read_partition_loads(self.client, self.keys, partitions)
        for partition, load in self.loads.items():
            samples = self._serving.setdefault(partition, deque(maxlen=RATE_WINDOW_S))
            samples.append(load.serving)
            self._remember(partition, load, sum(samples) / len(samples))

    def _remember(self, partition: Partition, load: PartitionLoad, mean_serving: float) -> None:
        """Keep the window's rate per worker unless it drained nothing: serving workers that
        finished nothing for RATE_WINDOW_S were idle, not slow, and drain a burst as before.
        Forgotten once no worker serves (the next ones may differ)."""
        if load.serving == 0:
            self._measured.pop(partition, None)
        elif load.online_per_s + load.bulk_per_s > 0:
            per_worker = PerWorker(load.online_per_s / mean_serving, load.bulk_per_s / mean_serving)
            self._measured[partition] = per_worker

    def load(self, model: str, variant: str) -> PartitionLoad | None:
        """The partition's load at the last refresh (None: not seen yet)."""
        return self.loads.get((model, variant))

    def lane_rate(self, config: ModelConfig, variant: str, bulk: bool) -> float:
        """Entries per second the lane should drain at now (0: unknown)."""
        load = self.loads.get((config.name, variant), PartitionLoad())
        measured = self._measured.get((config.name, variant))
        if load.serving == 0 or measured is None:
            return 0.0
        total = (measured.online + measured.bulk) * load.serving
        other_busy = measured.online > 0 if bulk else measured.bulk > 0
        share = config.bulk_share if bulk else 1.0
        return total * share / (1 + config.bulk_share) if other_busy else total

    def standing(self, config: ModelConfig, variant: str, bulk: bool, position: int) -> Standing:
        load = self.loads.get((config.name, variant), PartitionLoad())
        rate = self.lane_rate(config, variant, bulk)
        eta: int | None = None
        if rate > 0:
            eta = round(position / rate * 1000)
        elif position == 0 and load.serving:
            eta = 0  # an idle worker takes it at once
        return Standing(position, eta)

    def max_ahead(self, config: ModelConfig, variant: str, bulk: bool, start_by: StartBy) -> int:
        """Most entries that may wait ahead of a job for it to start by `start_by`, when the
        model admits by deadline and a rate is known; else -1 (no limit)."""
        if not config.queue.admit_by_deadline:
            return -1
        rate = self.lane_rate(config, variant, bulk)
        if rate <= 0:
            return -1
        budget_s = max(0.0, start_by.ms / 1000 - time.time())
        return math.floor(budget_s * rate)

    async def of(self, record: JobRecord) -> Standing | None:
        """A queued job's standing (one round trip), or None for a job enqueued before
        positions were kept or whose model is gone."""
        fields = record.fields
        config = self.repository.get(fields.get("model", ""))
        stream, seq, variant = fields.get("stream"), fields.get("seq"), fields.get("variant", "")
        if config is None or not stream or not (seq or fields.get("held")):
            return None
        tenant = fields.get("tenant", "default")
        position = await self.positions.position(stream, int(seq) if seq else None, tenant)
        bulk = stream == self.keys.bulk_queue(config.name, variant)
        return self.standing(config, variant, bulk, position)

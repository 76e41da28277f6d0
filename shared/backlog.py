"""Seconds of backlog: how long one replica would need to finish the work a partition holds, so a
pool can scale on work instead of entry counts (jobs that differ tenfold in cost are not alike).
The one formula, read by the producer's `conveyor_backlog_seconds` gauge and JSON route and by
the local autoscaler, and the one owner of `cv:cost:{model}:{variant}`.

    backlog_seconds = entries * units_per_job * seconds_per_unit
    scaling_seconds = min(backlog_seconds, entries * target_s)

- entries: XLEN of the online and bulk streams, queued plus in flight (what `streamLength`
  counts), plus the jobs a fair lane holds back outside its stream (its `held` count).
- unit: a job for `batch` models, a completion token for `generate` models; units_per_job is 1
  for `batch` models and the measured mean completion length for `generate` models (before any
  measurement: the max_tokens a job naming none runs with, `default_max_tokens` or 128, within
  `max_tokens_limit`).
- seconds_per_unit: one replica's measured cost, 1 ÷ its throughput. Workers measure it from
  their own counters at every heartbeat (wall seconds with a micro-batch in hand per job run,
  host work included; for `generate` models wall seconds with a generation running per token
  generated), smooth it and write it here in the
  heartbeat's transaction; before any worker has, `autoscaling.backlog.cost_estimate_s`.
- scaling_seconds, what a pool scales on (`target_s` per replica): a job runs on one replica,
  so no more replicas than jobs. One queued 20 s job with a 5 s target asked for four replicas,
  three of them idle (GPU pods)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from shared.codec import as_text
from shared.keys import Keys
from shared.model_repository import ModelConfig
from shared.partition_stats import held_count
from shared.redis_client import executed

COST_TTL_S = 7 * 86_400  # a removed model's measurement goes; a pool idle for a week re-measures
UNITS = {"batch": "job", "generate": "token"}


@dataclass(frozen=True, slots=True)
class ServiceCost:
    """What a replica measured: seconds per unit of work, and units per job."""

    seconds_per_unit: float
    units_per_job: float = 1.0

    def fields(self) -> dict[str, str]:
        return {
            "seconds_per_unit": f"{self.seconds_per_unit:.9g}",
            "units_per_job": f"{self.units_per_job:.9g}",
        }


@dataclass(frozen=True, slots=True)
class Backlog:
    """One partition's backlog, with the parts of the formula for whoever wants to see them."""

    model: str
    variant: str
    unit: str
    entries: int
    units_per_job: float
    seconds_per_unit: float
    measured: bool
    target_s: float  # one replica's share (autoscaling.backlog.target_s)

    @property
    def seconds(self) -> float:
        return self.entries * self.units_per_job * self.seconds_per_unit

    @property
    def scaling_seconds(self) -> float:
        return min(self.seconds, self.entries * self.target_s)

    def view(self) -> dict[str, Any]:
        """The JSON the producer serves (KEDA's metrics-api reads `backlog_seconds`, exact as the
        gauge and the local autoscaler have it: rounded to the microsecond, a queued job of a
        model faster than that read 0, which KEDA takes for no work, and the pool never woke)."""
        return {
            "model": self.model,
            "variant": self.variant,
            "backlog_seconds": self.seconds,
            "scaling_seconds": self.scaling_seconds,
            "entries": self.entries,
            "unit": self.unit,
            "units_per_job": round(self.units_per_job, 3),
            "seconds_per_unit": self.seconds_per_unit,
            "throughput_per_replica": round(1 / self.seconds_per_unit, 6),
            "measured": self.measured,
        }


def backlog_of(config: ModelConfig, variant: str, entries: int, cost: Mapping[Any, Any]) -> Backlog:
    """The formula: `cost` is the partition's cost hash as read (empty: not measured yet)."""
    fields = {as_text(k): _measure(v) for k, v in cost.items()}
    seconds_per_unit = fields.get("seconds_per_unit", 0.0)
    measured = seconds_per_unit > 0
    units_per_job = fields.get("units_per_job", 0.0)
    if units_per_job <= 0:
        units_per_job = _unmeasured_units_per_job(config, variant)
    return Backlog(
        config.name,
        variant,
        UNITS[config.kind],
        entries,
        units_per_job,
        seconds_per_unit if measured else config.autoscaling.backlog.cost_estimate_s,
        measured,
        config.autoscaling.backlog.target_s,
    )


def _measure(value: Any) -> float:
    """A cost field as a measure, 0 (not measured) for what is no finite number: a `nan` went
    through the formula (`min` keeps a NaN) to the autoscaler, the gauge and KEDA's route,
    and text failed the read."""
    try:
        number = float(value)
    except ValueError:
        return 0.0
    return number if math.isfinite(number) else 0.0


def queue_backlog_read(pipe: Any, keys: Keys, model: str, variant: str) -> None:
    """Add what the formula reads of one partition to a pipeline (sync or asyncio alike): the
    two lanes' XLEN and jobs held back by fair queuing, and the cost hash, READS commands."""
    for stream in (keys.queue(model, variant), keys.bulk_queue(model, variant)):
        pipe.xlen(stream)
        pipe.hget(keys.fair(stream), "held")
    pipe.hgetall(keys.service_cost(model, variant))


READS = 5


def backlog_from(config: ModelConfig, variant: str, replies: Sequence[Any]) -> Backlog:
    """The backlog from the READS replies `queue_backlog_read` asked for."""
    online, online_held, bulk, bulk_held, cost = replies
    entries = int(online) + held_count(online_held) + int(bulk) + held_count(bulk_held)
    return backlog_of(config, variant, entries, cost or {})


async def read_backlogs(
    client: aioredis.Redis, keys: Keys, partitions: Iterable[tuple[ModelConfig, str]]
) -> list[Backlog]:
    """Every partition's backlog in one pipelined round trip."""
    chosen = list(partitions)
    pipe = client.pipeline(transaction=False)
    for config, variant in chosen:
        queue_backlog_read(pipe, keys, config.name, variant)
    replies = await executed(pipe)  # a transport torn down under it: a lost connection
    return [
        backlog_from(config, variant, replies[i * READS : (i + 1) * READS])
        for i, (config, variant) in enumerate(chosen)
    ]


def queue_cost_write(pipe: Any, keys: Keys, model: str, variant: str, cost: ServiceCost) -> None:
    """Add the write of a replica's latest measurement to a pipeline (the heartbeat's)."""
    key = keys.service_cost(model, variant)
    pipe.hset(key, mapping=cost.fields())
    pipe.expire(key, COST_TTL_S)


def _unmeasured_units_per_job(config: ModelConfig, variant: str) -> float:
    """Tokens a generate job is expected to produce before any was measured: the max_tokens a
    job naming none runs with, within the variant's limit as the engine cuts it."""
    if config.kind == "batch":
        return 1.0
    return float(config.unnamed_max_tokens_of(variant))

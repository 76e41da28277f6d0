"""What KEDA's redis-streams scaler and the HPA behind it will decide, reproduced from their
source so tests (against a real Redis) and the local autoscaler predict the cluster exactly.

Sources: kedacore/keda `pkg/scalers/redis_streams_scaler.go` (metric per trigger mode, activity
is `value > activationLagCount`), go-redis v9 (a NULL `XINFO GROUPS` lag reads as -1) and
kubernetes `pkg/controller/podautoscaler/replica_calculator.go` (AverageValue external metrics:
`ceil(value / target)`, both in the whole thousandths KEDA sends, unless within the 10 %
tolerance of the current count). A pool scaled on seconds of backlog (KEDA's metrics-api or
prometheus scaler) is read here with the same formula the producer serves them
(shared/backlog.py), straight from Redis."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import redis

from shared.backlog import READS, backlog_from, queue_backlog_read
from shared.codec import as_text
from shared.keys import Keys
from shared.model_repository import ModelConfig

Mode = Literal["streamLength", "lagCount", "pendingEntriesCount"]

HPA_TOLERANCE = 0.1
NULL_LAG = -1  # what go-redis v9 (and so KEDA) reports when Redis answers `lag: nil`
_KEDA_DEFAULT_TARGET = 5  # `pendingEntriesCount` and `streamLength` default in KEDA


@dataclass(frozen=True, slots=True)
class StreamTrigger:
    """One `redis-streams` trigger, interpreted the way KEDA's metadata `Validate()` does."""

    stream: str
    mode: Mode
    target: int
    activation: int
    consumer_group: str | None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> StreamTrigger:
        """consumerGroup + lagCount → lag; consumerGroup alone → pending; no group → XLEN."""
        group = metadata.get("consumerGroup") or None
        lag_target = int(metadata.get("lagCount", "0"))
        mode: Mode
        if group is None:
            mode, target = "streamLength", int(metadata.get("streamLength", _KEDA_DEFAULT_TARGET))
        elif lag_target != 0:
            mode, target = "lagCount", lag_target
        else:
            mode = "pendingEntriesCount"
            target = int(metadata.get("pendingEntriesCount", _KEDA_DEFAULT_TARGET))
        return cls(
            stream=metadata["stream"],
            mode=mode,
            target=target,
            activation=int(metadata.get("activationLagCount", "0")),
            consumer_group=group,
        )

    def read(self, client: redis.Redis) -> Reading:
        return read_metric(client, self)


@dataclass(frozen=True, slots=True)
class BacklogTrigger:
    """A `metrics-api` or `prometheus` trigger on one pool's scaling seconds (its backlog
    seconds, at most `target_s` per job)."""

    config: ModelConfig
    variant: str
    keys: Keys
    target: float
    activation: float

    @classmethod
    def from_metadata(
        cls, metadata: Mapping[str, str], config: ModelConfig, variant: str, keys: Keys
    ) -> BacklogTrigger:
        """Target and activation as rendered: metrics-api's `targetValue` and
        `activationTargetValue`, or prometheus's `threshold` and `activationThreshold`."""
        target = metadata.get("targetValue") or metadata["threshold"]
        activation = metadata.get("activationTargetValue") or metadata.get("activationThreshold")
        return cls(config, variant, keys, float(target), float(activation or 0))

    def read(self, client: redis.Redis) -> Reading:
        pipe = client.pipeline(transaction=False)
        queue_backlog_read(pipe, self.keys, self.config.name, self.variant)
        replies = pipe.execute()
        backlog = backlog_from(self.config, self.variant, replies[:READS])
        return Reading(self, backlog.scaling_seconds)


Trigger = StreamTrigger | BacklogTrigger


@dataclass(frozen=True, slots=True)
class Reading:
    """One trigger's metric value at one poll."""

    trigger: Trigger
    value: float

    @property
    def active(self) -> bool:
        return self.value > self.trigger.activation


def stream_length(client: redis.Redis, stream: str) -> int:
    """XLEN: with acked entries deleted, this is queued plus in-flight work (0 when absent)."""
    return int(client.xlen(stream))


def pending_entries(client: redis.Redis, stream: str, group: str) -> int:
    """XPENDING summary count: entries delivered to a consumer and not yet acknowledged."""
    return int(client.xpending(stream, group)["pending"])


def group_lag(client: redis.Redis, stream: str, group: str) -> int:
    """XINFO GROUPS lag as KEDA reads it: 0 for a missing stream, XLEN for a missing group,
    -1 when Redis cannot compute it (tombstones from XDEL ahead of the group's position)."""
    _require_redis_7(client)
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError as exc:
        if "no such key" in str(exc):
            return 0
        raise
    for info in groups:
        if as_text(info["name"]) == group:
            lag = info.get("lag")
            return NULL_LAG if lag is None else int(lag)
    return stream_length(client, stream)


def read_metric(client: redis.Redis, trigger: StreamTrigger) -> Reading:
    """Poll one trigger exactly as the scaler's `getEntriesCountFn` does."""
    if trigger.mode == "streamLength":
        value = stream_length(client, trigger.stream)
    else:
        group = trigger.consumer_group or ""
        reader = group_lag if trigger.mode == "lagCount" else pending_entries
        value = reader(client, trigger.stream, group)
    return Reading(trigger, value)


def replicas_for_metric(
    value: float, target: float, current: int, tolerance: float = HPA_TOLERANCE
) -> int:
    """The HPA's count for one AverageValue external metric, before min/max clamping, on the
    whole thousandths KEDA hands it (`_milli`): on floats, three jobs' 0.1 s each of backlog at a
    0.1 s target read 3.0000000000000004 replicas' worth, and asked for four."""
    usage, per_replica = _milli(value), _milli(target)
    if per_replica <= 0:
        raise ValueError(
            "an AverageValue target must round to 0.001 or more (KEDA sends thousandths)"
        )
    current = max(current, 1)
    if abs(1.0 - usage / (per_replica * current)) <= tolerance:
        return current
    return math.ceil(usage / per_replica)


def desired_replicas(
    readings: Iterable[Reading], min_replicas: int, max_replicas: int, current: int
) -> int:
    """Steady-state replica count of one ScaledObject: 0 when no trigger is active and min is 0
    (KEDA, after cooldown), otherwise the HPA's max over metrics, clamped to [max(min,1), max].
    Time-based HPA behaviour is not modelled here (the local autoscaler adds the scale-down
    stabilization window)."""
    readings = list(readings)
    if min_replicas == 0 and not any(r.active for r in readings):
        return 0
    floor = max(min_replicas, 1)
    # KEDA first lifts a scaled-to-zero target to the HPA's minimum; the HPA continues from there.
    start = current if current > 0 else floor
    counts = [replicas_for_metric(r.value, r.trigger.target, start) for r in readings]
    return min(max(max(counts, default=floor), floor), max_replicas)


def poll(client: redis.Redis, triggers: Iterable[Trigger]) -> list[Reading]:
    """Read every trigger of one ScaledObject."""
    return [trigger.read(client) for trigger in triggers]


def _require_redis_7(client: redis.Redis) -> None:
    """KEDA refuses `lagCount` below Redis 7 (XINFO GROUPS has no lag field there)."""
    version = str(client.info("server")["redis_version"])
    if int(version.split(".")[0]) < 7:
        raise RuntimeError(f"lagCount needs Redis 7+, server reports {version}")


def _milli(value: float) -> int:
    """A metric value or target as KEDA 2.20+ sends it to the HPA: a quantity parsed from
    `%.3f`, the nearest whole thousandth of the exact binary value (Go's and Python's formatting
    alike: 0.0995 is 100, 0.0005 is 1), with NaN, infinite or negative read as 0.
    KEDA 2.12-2.19 cut instead (`int64(value * 1000)`): a metric one thousandth lower at most,
    and a target no further off (BacklogScaling refuses any that would matter)."""
    if not math.isfinite(value) or value < 0:
        return 0
    return int(f"{value:.3f}".replace(".", ""))  # its digits are the thousandths, exactly

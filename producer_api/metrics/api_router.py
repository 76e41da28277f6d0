"""`GET /metrics`: the producer's own counters plus partition gauges (lag, pending, DLQ depth,
oldest queued age, backlog seconds) refreshed from Redis at most once a second, so a 5 s scrape
stays cheap, and read for `READ_TIMEOUT_S` at most: a Redis that stopped answering without
closing its connections held the scrape for the client's timeouts and retries (seconds each),
past Prometheus' scrape timeout, and the process's own counters went missing with the gauges.
Under several producer processes on one port (PROMETHEUS_MULTIPROC_DIR set, by
`conveyor up --producers N`), whichever process a scrape reaches answers for all of them
(shared/metrics.py): it had answered with its own share of the counters.
`GET /metrics/backlog/{model}/{variant}`: one pool's backlog seconds as JSON, what KEDA's
metrics-api scaler reads; like `/metrics` it needs no API key (queue depths only)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)
from prometheus_client.registry import Collector
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.responses import Response

from producer_api.errors import ConveyorError
from producer_api.responses import FastJSONResponse
from producer_api.state import ProducerState, producer_state
from shared.backlog import read_backlogs
from shared.dead_letters import delist_lettered, read_lettered
from shared.metrics import (
    BACKLOG_SCALING_SECONDS,
    BACKLOG_SECONDS,
    DLQ_DEPTH,
    MULTIPROC_DIR,
    OLDEST_AGE,
    PARTITION_LAG,
    PARTITION_PENDING,
    hide,
)
from shared.model_names import NAME
from shared.partition_stats import read_dlq_depths, read_partition_stats

router = APIRouter(tags=["health"])
_REFRESH_S = 1.0
READ_TIMEOUT_S = 1.0  # two pipelined round trips; a scrape's timeout is 10 s by default
_last_refresh = 0.0
# The unserved partitions whose `conveyor_dlq_depth` this process exports: one that leaves the
# index is hidden, whichever process took it out.
_unserved_shown: set[tuple[str, str]] = set()
# What a gauge read raises while Redis, or the cluster, is out of reach or misconfigured: redis-py
# raises a RedisClusterException (no RedisError) where shared/redis_client.py does not make it an
# outage; a read past `READ_TIMEOUT_S`, a TimeoutError. The scrape still answers with the
# process's counters and the gauges' last values.
_UNREAD = (RedisError, RedisClusterException, TimeoutError)


async def _refresh_gauges(state: ProducerState) -> None:
    global _last_refresh
    if time.monotonic() - _last_refresh < _REFRESH_S:
        return
    _last_refresh = time.monotonic()
    read = await read_partition_stats(state.redis, state.keys, state.repository)
    for partition in read:
        labels = (partition.model, partition.variant)
        for lane_name, lane in (("online", partition.online), ("bulk", partition.bulk)):
            PARTITION_LAG.labels(*labels, lane_name).set(lane.lag)
            PARTITION_PENDING.labels(*labels, lane_name).set(lane.pending)
            OLDEST_AGE.labels(*labels, lane_name).set(lane.oldest_age_s)
        DLQ_DEPTH.labels(*labels).set(partition.dlq_depth)
    await _refresh_unserved_dlq_depths(state)
    # those read: one left out (a key of another type) would refuse the backlogs' read too
    shown = {(p.model, p.variant) for p in read}
    partitions = [
        (config, variant)
        for config in state.repository
        for variant in config.variants
        if (config.name, variant) in shown
    ]
    for backlog in await read_backlogs(state.redis, state.keys, partitions):
        BACKLOG_SECONDS.labels(backlog.model, backlog.variant).set(backlog.seconds)
        BACKLOG_SCALING_SECONDS.labels(backlog.model, backlog.variant).set(backlog.scaling_seconds)


async def _refresh_unserved_dlq_depths(state: ProducerState) -> None:
    """`conveyor_dlq_depth` of the partitions holding letters that the repository no longer
    serves (a variant or model taken out keeps its letters, which raised no gauge and no alert):
    the index of partitions that dead-lettered (`lettered_partitions`), less the served ones.
    One found with no letter left (all purged or replayed, or its stream gone) leaves the index
    (`delist_lettered`) and the scrape: it reported 0 for ever. A letter dying meanwhile is not
    lost: `delist_lettered` lists its partition again. Members naming no partition leave the
    index in the same SREM."""
    served = {(config.name, variant) for config in state.repository for variant in config.variants}
    lettered, malformed = await read_lettered(state.redis, state.keys)
    unserved = [partition for partition in lettered if partition not in served]
    emptied: list[tuple[str, str]] = []
    for model, variant, depth in await read_dlq_depths(state.redis, state.keys, unserved):
        if depth:
            DLQ_DEPTH.labels(model, variant).set(depth)
        else:
            emptied.append((model, variant))
    emptied = await delist_lettered(state.redis, state.keys, emptied, malformed)
    shown = set(unserved) - set(emptied)
    # and those another producer process delisted: this one no longer reads them
    for partition in (_unserved_shown - shown - served) | set(emptied):
        hide(DLQ_DEPTH, *partition)
    _unserved_shown.clear()
    _unserved_shown.update(shown)


@router.get("/metrics", include_in_schema=False)
async def metrics(state: Annotated[ProducerState, Depends(producer_state)]) -> Response:
    """In the text format whatever the scrape's Accept asks: OpenMetrics, which Prometheus asks
    for first, fails a whole scrape on one family name another library's metrics clash with
    (vLLM's `prompt_tokens_by_source`, in a process that loaded it)."""
    with contextlib.suppress(*_UNREAD):
        async with asyncio.timeout(READ_TIMEOUT_S):
            await _refresh_gauges(state)
    return Response(generate_latest(_registry()), media_type=CONTENT_TYPE_LATEST)


def _registry() -> Collector:
    """Every producer process's metrics when they share a directory, else this one's."""
    if MULTIPROC_DIR not in os.environ:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


@router.get("/metrics/backlog/{model}/{variant}", include_in_schema=False)
async def backlog(
    state: Annotated[ProducerState, Depends(producer_state)],
    model: Annotated[str, Path(pattern=NAME)],
    variant: Annotated[str, Path(pattern=NAME)],
) -> FastJSONResponse:
    """Seconds one replica needs for the pool's queued and running work, with the formula's
    parts (shared/backlog.py); read from Redis on every call, for `READ_TIMEOUT_S` at most (a
    503 past it): KEDA's metrics-api scaler gives up after 3 s, and a read that waited on a
    frozen Redis for the client's timeouts failed its poll with nothing said."""
    config = state.repository.get(model)
    if config is None or variant not in config.variants:
        raise ConveyorError(404, "not_found", f"no pool {model}:{variant}")
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            (found,) = await read_backlogs(state.redis, state.keys, [(config, variant)])
    except TimeoutError:
        raise RedisTimeoutError(f"the backlog read took over {READ_TIMEOUT_S:g} s") from None
    return FastJSONResponse(found.view())

"""`GET /metrics`: the producer's own counters plus partition gauges (lag, pending, DLQ depth,
oldest queued age) refreshed from Redis at most once a second, so a 5 s scrape stays cheap."""

from __future__ import annotations

import contextlib
import time
from typing import Annotated

from fastapi import APIRouter, Depends
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError
from starlette.responses import Response

from producer_api.state import ProducerState, producer_state
from shared.metrics import DLQ_DEPTH, OLDEST_AGE, PARTITION_LAG, PARTITION_PENDING
from shared.partition_stats import read_partition_stats

router = APIRouter(tags=["health"])
_REFRESH_S = 1.0
_last_refresh = 0.0


async def _refresh_gauges(state: ProducerState) -> None:
    global _last_refresh
    if time.monotonic() - _last_refresh < _REFRESH_S:
        return
    _last_refresh = time.monotonic()
    for partition in await read_partition_stats(state.redis, state.keys, state.repository):
        labels = (partition.model, partition.variant)
        for lane_name, lane in (("online", partition.online), ("bulk", partition.bulk)):
            PARTITION_LAG.labels(*labels, lane_name).set(lane.lag or 0)
            PARTITION_PENDING.labels(*labels, lane_name).set(lane.pending)
            OLDEST_AGE.labels(*labels, lane_name).set(lane.oldest_age_s)
        DLQ_DEPTH.labels(*labels).set(partition.dlq_depth)


@router.get("/metrics", include_in_schema=False)
async def metrics(state: Annotated[ProducerState, Depends(producer_state)]) -> Response:
    with contextlib.suppress(RedisError):  # still serve the process's counters if Redis is down
        await _refresh_gauges(state)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

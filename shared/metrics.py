"""Prometheus metric families (prefix `conveyor_`, labels `model`/`variant`, and `lane` where the
online and bulk lanes differ; never job ids).
Both processes import this one module; a family only appears in a process's scrape once that
process has observed it. Several producer processes sharing one port (`conveyor up --producers
N`) keep their metrics in PROMETHEUS_MULTIPROC_DIR, so a scrape of any of them answers for all
(producer_api/metrics): counters and histograms are summed, gauges read from Redis are the most
recent any live one set, and a gauge of each process's own state keeps a series per live process
(`pid` label). The modes are ignored elsewhere (a worker, a lone producer)."""

from __future__ import annotations

import os
from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from shared.model_repository import MAX_JOBS_PER_READ

PARTITION = ("model", "variant")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Waits in a queue: up to `queue.max_queue_time_s` (10 minutes by default), and a Batch API
# item's whole completion window (a day); topped at 60 s, every quantile of a backlog read 60.
WAIT_BUCKETS = (*LATENCY_BUCKETS, 120, 300, 600, 1800, 3600, 21600, 86400)
# Powers of 2 up to the largest batch a model may be configured for: topped at 256, every
# quantile of a pool batching more read 256.
BATCH_BUCKETS = tuple(2**n for n in range((MAX_JOBS_PER_READ - 1).bit_length() + 1))
# Up to 600 s: a request may hold its connection that long (a long-poll's `wait`, a predict's
# `timeout`), and a micro-batch may run on the engine that long (`queue.max_run_s`'s default);
# topped at 60 s, every quantile of those routes, or of a slow CPU engine's calls, read 60.
TEN_MINUTE_BUCKETS = (*LATENCY_BUCKETS, 120, 300, 600)
# Gauges under several producer processes (see above): one value, the latest a live one set;
# or a series per live process, for what each applies itself.
MULTIPROC_DIR: Final = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own variable
# A dead process's values are dropped (`remove` cannot clear a value another process's file
# holds): a dead canary leader's, and what one read from Redis, which for a model taken out of
# config.yaml before it came back no live process reads again, and stayed at its last values.
LATEST_LIVE: Final = "livemostrecent"
OWN: Final = "liveall"

JOBS_SUBMITTED = Counter(
    "conveyor_jobs_submitted", "Jobs accepted by the producer", (*PARTITION, "lane")
)
JOBS_REJECTED = Counter(
    "conveyor_jobs_rejected", "Submits refused (queue full, Redis down)", (*PARTITION, "reason")
)
JOBS_FINISHED = Counter(
    "conveyor_jobs_finished", "Jobs that reached a terminal state", (*PARTITION, "state")
)
# Per lane: a bulk lane's jobs wait hours by design, which an online lane's quantiles must not
# take in.
QUEUE_WAIT = Histogram(
    "conveyor_queue_wait_seconds",
    "Enqueue to claim by a worker",
    (*PARTITION, "lane"),
    buckets=WAIT_BUCKETS,
)
ENGINE_TIME = Histogram(
    "conveyor_engine_seconds", "Engine time per micro-batch", PARTITION, buckets=TEN_MINUTE_BUCKETS
)
E2E_LATENCY = Histogram(
    "conveyor_e2e_latency_seconds",
    "Enqueue to terminal state",
    (*PARTITION, "lane"),
    buckets=WAIT_BUCKETS,
)
BATCH_SIZE = Histogram(
    "conveyor_batch_size", "Jobs per engine call", PARTITION, buckets=BATCH_BUCKETS
)
TTFT = Histogram(  # the queue wait included
    "conveyor_ttft_seconds", "Time to first token", PARTITION, buckets=WAIT_BUCKETS
)
TPOT = Histogram(
    "conveyor_tpot_seconds", "Time per output token", PARTITION, buckets=LATENCY_BUCKETS
)
TOKENS = Counter("conveyor_tokens_generated", "Completion tokens generated", PARTITION)
BATCH_BUSY = Counter(
    "conveyor_batch_busy_seconds",
    "Wall time with a micro-batch in hand, read to write-back (overlapping ones once)",
    PARTITION,
)
GENERATE_BUSY = Counter(
    "conveyor_generate_busy_seconds", "Wall time with a generation running", PARTITION
)

PARTITION_LAG = Gauge(
    "conveyor_partition_lag",
    "Entries not yet delivered",
    (*PARTITION, "lane"),
    multiprocess_mode=LATEST_LIVE,
)
PARTITION_PENDING = Gauge(
    "conveyor_partition_pending",
    "Entries delivered, not yet acknowledged",
    (*PARTITION, "lane"),
    multiprocess_mode=LATEST_LIVE,
)
DLQ_DEPTH = Gauge("conveyor_dlq_depth", "Dead letters", PARTITION, multiprocess_mode=LATEST_LIVE)
BACKLOG_SECONDS = Gauge(
    "conveyor_backlog_seconds",
    "Seconds one replica needs for the partition's queued and running work",
    PARTITION,
    multiprocess_mode=LATEST_LIVE,
)
BACKLOG_SCALING_SECONDS = Gauge(
    "conveyor_backlog_scaling_seconds",
    "The backlog seconds a pool scales on: at most target_s per job (a job runs on one replica)",
    PARTITION,
    multiprocess_mode=LATEST_LIVE,
)
OLDEST_AGE = Gauge(
    "conveyor_oldest_queued_age_seconds",
    "Age of the oldest undelivered entry",
    (*PARTITION, "lane"),
    multiprocess_mode=LATEST_LIVE,
)

HTTP_REQUESTS = Counter("conveyor_http_requests", "HTTP requests", ("method", "route", "status"))
HTTP_LATENCY = Histogram(
    "conveyor_http_request_seconds",
    "HTTP request latency",
    ("method", "route"),
    buckets=TEN_MINUTE_BUCKETS,
)

# Live traffic (issue 13): what the routes say, what shadows and canaries do.
ROUTE_WEIGHT = Gauge(
    "conveyor_route_weight", "Live routes: percent of requests", PARTITION, multiprocess_mode=OWN
)
ROUTES_VERSION = Gauge(
    "conveyor_routes_version", "Global routes version this producer applies", multiprocess_mode=OWN
)
SHADOW_COPIES = Counter(
    "conveyor_shadow_copies", "Shadow copies of online requests", (*PARTITION, "outcome")
)
SHADOW_PAIRS_DROPPED = Counter(
    "conveyor_shadow_pairs_dropped",
    "Shadow pairs dropped uncompared (a job vanished or ended unrun, or ran on too long)",
    (*PARTITION, "reason"),
)
CANARY_WEIGHT = Gauge(
    "conveyor_canary_weight",
    "Percent of traffic on a canary",
    PARTITION,
    multiprocess_mode=LATEST_LIVE,
)
CANARY_STATE = Gauge(
    "conveyor_canary_state",
    "1 for the canary's current state",
    (*PARTITION, "state"),
    multiprocess_mode=LATEST_LIVE,
)


def hide(gauge: Gauge, *labels: str) -> None:
    """Take a gauge's series out of the scrape. Under several producer processes `remove` cannot
    (prometheus_client keeps the value in the process's file, and only warns): a canary leader
    that stepped down, or whose canary's record was gone, showed its last weight and state for
    as long as it lived. There the series reads 0, which a newer value from a live process
    replaces."""
    if MULTIPROC_DIR in os.environ:
        gauge.labels(*labels).set(0)
    else:
        gauge.remove(*labels)

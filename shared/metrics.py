"""Prometheus metric families (prefix `conveyor_`, labels `model`/`variant`, never job ids).
Both processes import this one module; a family only appears in a process's scrape once that
process has observed it."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PARTITION = ("model", "variant")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

JOBS_SUBMITTED = Counter(
    "conveyor_jobs_submitted", "Jobs accepted by the producer", (*PARTITION, "lane")
)
JOBS_REJECTED = Counter(
    "conveyor_jobs_rejected", "Submits refused (queue full, Redis down)", (*PARTITION, "reason")
)
JOBS_FINISHED = Counter(
    "conveyor_jobs_finished", "Jobs that reached a terminal state", (*PARTITION, "state")
)
QUEUE_WAIT = Histogram(
    "conveyor_queue_wait_seconds",
    "Enqueue to claim by a worker",
    PARTITION,
    buckets=LATENCY_BUCKETS,
)
ENGINE_TIME = Histogram(
    "conveyor_engine_seconds", "Engine time per micro-batch", PARTITION, buckets=LATENCY_BUCKETS
)
E2E_LATENCY = Histogram(
    "conveyor_e2e_latency_seconds",
    "Enqueue to terminal state",
    PARTITION,
    buckets=LATENCY_BUCKETS,
)
BATCH_SIZE = Histogram(
    "conveyor_batch_size", "Jobs per engine call", PARTITION, buckets=BATCH_BUCKETS
)
TTFT = Histogram("conveyor_ttft_seconds", "Time to first token", PARTITION, buckets=LATENCY_BUCKETS)
TPOT = Histogram(
    "conveyor_tpot_seconds", "Time per output token", PARTITION, buckets=LATENCY_BUCKETS
)
TOKENS = Counter("conveyor_tokens_generated", "Completion tokens generated", PARTITION)
GENERATE_BUSY = Counter(
    "conveyor_generate_busy_seconds", "Wall time with a generation running", PARTITION
)

PARTITION_LAG = Gauge("conveyor_partition_lag", "Entries not yet delivered", (*PARTITION, "lane"))
PARTITION_PENDING = Gauge(
    "conveyor_partition_pending", "Entries delivered, not yet acknowledged", (*PARTITION, "lane")
)
DLQ_DEPTH = Gauge("conveyor_dlq_depth", "Dead letters", PARTITION)
BACKLOG_SECONDS = Gauge(
    "conveyor_backlog_seconds",
    "Seconds one replica needs for the partition's queued and running work",
    PARTITION,
)
OLDEST_AGE = Gauge(
    "conveyor_oldest_queued_age_seconds",
    "Age of the oldest undelivered entry",
    (*PARTITION, "lane"),
)

HTTP_REQUESTS = Counter("conveyor_http_requests", "HTTP requests", ("method", "route", "status"))
HTTP_LATENCY = Histogram(
    "conveyor_http_request_seconds",
    "HTTP request latency",
    ("method", "route"),
    buckets=LATENCY_BUCKETS,
)

# Live traffic (issue 13): what the routes say, what shadows and canaries do.
ROUTE_WEIGHT = Gauge("conveyor_route_weight", "Live routes: percent of requests", PARTITION)
ROUTES_VERSION = Gauge("conveyor_routes_version", "Global routes version this producer applies")
SHADOW_COPIES = Counter(
    "conveyor_shadow_copies", "Shadow copies of online requests", (*PARTITION, "outcome")
)
CANARY_WEIGHT = Gauge("conveyor_canary_weight", "Percent of traffic on a canary", PARTITION)
CANARY_STATE = Gauge(
    "conveyor_canary_state", "1 for the canary's current state", (*PARTITION, "state")
)

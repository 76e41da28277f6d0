"""The Celery application workers run as (`celery -A workers.app worker`): Celery owns the
process lifecycle; the StreamConsumer bootstep does the inference work on its own thread, so
Celery's pool runs only webhook deliveries: CONVEYOR_WEBHOOK_CONCURRENCY of them at once (above
1, on threads; the solo pool delivers one event at a time, every tenant's webhook behind a slow
receiver's)."""

from __future__ import annotations

import asyncio
from typing import Any

from celery import Celery, signals
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from redis.exceptions import RedisClusterException, RedisError

from shared.celery_broker import broker_app
from shared.redis_client import topology_read
from shared.settings import masked_url, settings_or_exit
from shared.telemetry import configure_logging, configure_tracing
from workers.partition.redis_backoff import until_done
from workers.runtime.broker_outage_log import BrokerOutageLog
from workers.runtime.consumer_runtime import start_wait_s
from workers.runtime.heartbeat import WorkerHeartbeat
from workers.runtime.metrics_server import MetricsServer
from workers.runtime.stream_consumer import StreamConsumer

settings = settings_or_exit()
configure_logging(settings.log_level)
BrokerOutageLog.install()


@signals.setup_logging.connect
def _keep_conveyor_logging(**_: Any) -> None:
    """A receiver here makes Celery leave logging alone: without one it set the root logger
    to the worker's `--loglevel` (Celery's default WARNING when none is given), whatever
    CONVEYOR_LOG_LEVEL said."""
    configure_logging(settings.log_level)


if configure_tracing("conveyor-worker"):
    CeleryInstrumentor().instrument()


def _broker_app_or_exit() -> Celery:
    """The worker's Celery app; a cluster whose topology it cannot read (CONVEYOR_REDIS_CLUSTER
    with a server that is no cluster node, credentials refused) ends the worker in one line:
    the read runs as Celery imports this module, which printed the error as Celery's traceback
    under `Unable to load celery application` (exit 2). A cluster no node of which answers is
    waited out, as a single server is, within the start's wait (`start_wait_s`): the worker
    exited at once, where one started beside its Redis waits for it."""
    if not settings.redis_cluster:  # nothing read: Celery's consumer waits for the server
        return _broker_app()
    wait_s = start_wait_s(settings)
    try:
        return asyncio.run(asyncio.wait_for(_cluster_broker_app(), wait_s))
    except (RedisError, RedisClusterException, TimeoutError) as exc:
        where = masked_url(settings.redis_url)
        why = f"no node answered within {wait_s:g}s" if isinstance(exc, TimeoutError) else exc
        raise SystemExit(f"Error: cannot use the Redis cluster at {where}: {why}") from None


def _broker_app() -> Celery:
    """The app; on a cluster, built from the layout read now (`broker_app`)."""
    with topology_read():  # no node answering: an outage (ClusterUnreachable)
        return broker_app(settings.redis_url, include=["workers.webhook_delivery"])


async def _cluster_broker_app() -> Celery:
    """The app, its cluster's layout read through outages (one log line per outage)."""
    what = "worker start: the cluster's layout"
    return await until_done(lambda: asyncio.to_thread(_broker_app), asyncio.Event(), what)


app = _broker_app_or_exit()
app.conf.update(
    # the pool for a bare `celery -A workers.app worker` too; a `--pool` given still rules (one
    # delivery at a time needs no thread: the solo pool)
    worker_pool="threads" if settings.webhook_concurrency > 1 else "solo",
    worker_concurrency=settings.webhook_concurrency,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,  # one unacknowledged delivery per thread
    worker_consumer="workers.runtime.broker_consumer:Consumer",  # backs off its restarts
    task_acks_late=True,
    # Celery 6's default, said here because Celery 5 warns on every reconnect without it. A
    # thread cannot be cancelled (Celery logs that it failed to): the delivery runs on, and the
    # copy kombu restores finds its attempt claimed (`duplicate`, workers/webhook_delivery.py)
    worker_cancel_long_running_tasks_on_connection_loss=True,
)
app.steps["worker"].add(WorkerHeartbeat)
app.steps["worker"].add(StreamConsumer)
app.steps["worker"].add(MetricsServer)

"""Celery's own Redis connections (its broker: webhook deliveries) get the bounds every other
pool has, so a frozen Redis delays a publish by `CONVEYOR_REDIS_TIMEOUT_S` instead of forever.
The socket timeout leaves room for kombu's BRPOP, which blocks `BRPOP_S` on an idle queue.

kombu speaks to one server. On a cluster (`CONVEYOR_REDIS_CLUSTER`) every kombu key gets the
prefix `BROKER_TAG`, so all of them live in one slot, and kombu is pointed at the master that
owns it, found when the app is made. A failover of that master stops webhook hand-offs until
the process restarts (docs/redis-cluster.md); jobs and results are not affected."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from celery import Celery
from redis.cluster import RedisCluster

from shared.settings import get_settings

BRPOP_S = 1.0  # kombu's default brpop_timeout
BROKER_TAG = "{celery}"


def broker_app(broker_url: str, **options: Any) -> Celery:
    """A Celery app on `broker_url` (on a cluster: on the master of kombu's slot) whose broker
    sockets time out."""
    settings = get_settings()
    timeout = settings.redis_timeout_s
    transport: dict[str, Any] = {
        "socket_timeout": timeout + BRPOP_S,
        "socket_connect_timeout": timeout,
    }
    if settings.redis_cluster:
        broker_url = _slot_master(broker_url)
        transport["global_keyprefix"] = BROKER_TAG
    app = Celery("conveyor", broker=broker_url, **options)
    app.conf.broker_transport_options = transport
    return app


def _slot_master(cluster_url: str) -> str:
    """`cluster_url` (any node) with its host and port replaced by BROKER_TAG's master's."""
    cluster = RedisCluster.from_url(cluster_url)
    try:
        node = cluster.get_node_from_key(BROKER_TAG)
    finally:
        cluster.close()
    parts = urlsplit(cluster_url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{node.host}:{node.port}" if credentials else f"{node.host}:{node.port}"
    return urlunsplit(parts._replace(netloc=netloc, path="/0"))

"""Celery's own Redis connections (its broker: webhook deliveries) get the bounds every other
pool has, so a frozen Redis delays a publish by `CONVEYOR_REDIS_TIMEOUT_S` instead of forever.
The socket timeout leaves room for kombu's BRPOP, which blocks `BRPOP_S` on an idle queue.

kombu speaks to one server. On a cluster (`CONVEYOR_REDIS_CLUSTER`) every kombu key gets the
prefix `BROKER_TAG`, so all of them live in one slot, and kombu is pointed at the master that
owns it. Every node of the cluster is a kombu alternate, and `following_the_slot` is kombu's
failover strategy: after a connection error kombu switches to whichever node owns the slot now,
so a failover of that master pauses webhook hand-offs until a replica is promoted, no longer."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from celery import Celery
from redis.cluster import ClusterNode
from redis.exceptions import RedisClusterException, RedisError

from shared.redis_client import blocking_cluster
from shared.settings import get_settings

BRPOP_S = 1.0  # kombu's default brpop_timeout
# When kombu gives a delivery a worker took but never acknowledged (it died) to another: past
# the longest retry countdown a live worker holds (5 min) and the attempt after it, far within
# CONVEYOR_WEBHOOK_RETRY_FOR_S. kombu's hour had a dead worker's retry wait that long, and the
# task then found itself out of time after one more attempt.
VISIBILITY_TIMEOUT_S = 900.0
BROKER_TAG = "{celery}"


def broker_app(broker_url: str, **options: Any) -> Celery:
    """A Celery app on `broker_url` (on a cluster: on the master of kombu's slot, following it
    through failovers) whose broker sockets time out."""
    settings = get_settings()
    timeout = settings.redis_timeout_s
    transport: dict[str, Any] = {
        "socket_timeout": timeout + BRPOP_S,
        "socket_connect_timeout": timeout,
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
    }
    if settings.redis_cluster:
        broker_url = ";".join(_node_urls(broker_url))
        transport["global_keyprefix"] = BROKER_TAG
    broker_url = kombu_url(broker_url)
    app = Celery("conveyor", broker=broker_url, **options)
    app.conf.broker_transport_options = transport
    if settings.redis_cluster:
        app.conf.broker_failover_strategy = following_the_slot
    return app


def kombu_url(redis_url: str) -> str:
    """redis-py's Unix-socket URL (`unix://[user:password@]/path?db=N`) in kombu's spelling
    (`redis+socket://`, the database as `virtual_host`); other URLs are the same for both."""
    parts = urlsplit(redis_url)
    if parts.scheme != "unix":
        return redis_url
    query = parse_qs(parts.query)
    query["virtual_host"] = query.pop("db", ["0"])
    return f"redis+socket://{parts.netloc}{parts.path}?{urlencode(query, doseq=True)}"


def following_the_slot(urls: list[str]) -> Iterator[str]:
    """kombu's failover strategy on a cluster: each switch (after a connection error) goes to
    the node that owns BROKER_TAG's slot now, as the first node of `urls` that answers says;
    while none does, to the nodes in turn."""
    yield urls[0]  # kombu skips the first: the URL it starts on
    for fallback in itertools.cycle(urls):
        yield _slot_owner(urls) or fallback


def _slot_owner(urls: list[str]) -> str | None:
    for url in urls:
        try:
            return _node_urls(url)[0]
        except (RedisError, RedisClusterException):  # that node is down, or the slot is moving
            continue
    return None


def _node_urls(cluster_url: str) -> list[str]:
    """The URL of every node of the cluster `cluster_url` names (any node; or else one of
    `CONVEYOR_REDIS_CLUSTER_NODES`), BROKER_TAG's master first."""
    settings = get_settings()
    cluster = blocking_cluster(
        cluster_url, settings.redis_cluster_nodes, socket_connect_timeout=settings.redis_timeout_s
    )
    try:
        owner = cluster.get_node_from_key(BROKER_TAG)
        others = [node for node in cluster.get_nodes() if node.name != owner.name]
    finally:
        cluster.close()
    return [_node_url(cluster_url, node) for node in (owner, *others)]


def _node_url(cluster_url: str, node: ClusterNode) -> str:
    """`cluster_url` with its host and port replaced by `node`'s (an IPv6 address bracketed:
    bare, `redis://fd00::2:7001` is no URL kombu can read)."""
    parts = urlsplit(cluster_url)
    credentials = parts.netloc.rpartition("@")[0]
    host = f"[{node.host}]" if ":" in node.host else node.host
    netloc = f"{credentials}@{host}:{node.port}" if credentials else f"{host}:{node.port}"
    return urlunsplit(parts._replace(netloc=netloc, path="/0"))

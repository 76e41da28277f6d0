"""Celery's own Redis connections (its broker: webhook deliveries) get the bounds every other
pool has, so a frozen Redis delays a publish by `CONVEYOR_REDIS_TIMEOUT_S` instead of forever.
The socket timeout leaves room for kombu's BRPOP, which blocks `BRPOP_S` on an idle queue.

kombu speaks to one server. On a cluster (`CONVEYOR_REDIS_CLUSTER`) every kombu key gets the
prefix `BROKER_TAG`, so all of them live in one slot, and kombu is pointed at the master that
owns it. Every node of the cluster is a kombu alternate, and `following_the_slot` is kombu's
failover strategy: after a connection error kombu switches to whichever node owns the slot now,
so a failover of that master pauses webhook hand-offs until a replica is promoted, no longer.

kombu gets every URL with the scheme of Conveyor's own transport (`shared.broker_transport`),
whose channels survive losing their server with deliveries in hand."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from celery import Celery
from redis.cluster import ClusterNode
from redis.exceptions import RedisClusterException, RedisError

from shared.broker_transport import SCHEME
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
    nodes = _node_urls(broker_url) if settings.redis_cluster else [broker_url]
    app = Celery("conveyor", broker=kombu_url(";".join(nodes)), **options)
    if settings.redis_cluster:
        transport["global_keyprefix"] = BROKER_TAG
        app.conf.broker_failover_strategy = partial(following_the_slot, nodes)
    app.conf.broker_transport_options = transport
    return app


def kombu_url(redis_url: str) -> str:
    """redis-py's URL (or `;`-separated URLs) in kombu's spelling, on Conveyor's transport
    (`SCHEME`). A Unix socket's (`unix://[user:password@]/path?db=N`) is `SCHEME+socket://`,
    the database as `virtual_host`. A TCP one keeps only its `ssl_*` options, kombu's TLS
    options, and its `?db=N` as its path (redis-py reads that before the path's): kombu's
    Connection raised TypeError at any other key (redis-py's `protocol`, `client_name`, ...;
    its connections get their bounds from `broker_transport_options`), and no webhook was
    handed over. A `rediss://` one verifies the server's certificate unless its
    `ssl_cert_reqs` says otherwise, as redis-py does (under a scheme that is not `rediss`,
    kombu would not use TLS at all; under `rediss` it verified nothing)."""
    return ";".join(_kombu_url(url) for url in redis_url.split(";"))


def _kombu_url(redis_url: str) -> str:
    parts = urlsplit(redis_url)
    query = parse_qs(parts.query, keep_blank_values=True)
    if parts.scheme == "unix":
        query["virtual_host"] = query.pop("db", ["0"])
        return f"{SCHEME}+socket://{parts.netloc}{parts.path}?{urlencode(query, doseq=True)}"
    if database := query.pop("db", None):
        parts = parts._replace(path=f"/{database[0]}")
    query = {key: values for key, values in query.items() if key.startswith("ssl_")}
    if parts.scheme == "rediss":
        query.setdefault("ssl_cert_reqs", ["required"])
    return urlunsplit(parts._replace(scheme=SCHEME, query=urlencode(query, doseq=True)))


def following_the_slot(nodes: list[str], alternates: list[str]) -> Iterator[str]:
    """kombu's failover strategy on a cluster (`alternates`: kombu's URLs of `nodes`, whose
    own are redis-py's): each switch (after a connection error) goes to the node that owns
    BROKER_TAG's slot now, as the first of `nodes` that answers says; while none does, to the
    nodes in turn."""
    yield alternates[0]  # kombu skips the first: the URL it starts on
    for fallback in itertools.cycle(alternates):
        owner = _slot_owner(nodes)
        yield fallback if owner is None else kombu_url(owner)


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

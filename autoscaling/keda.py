"""Render KEDA objects from the model repository: one ScaledObject per worker pool (model,
variant) that scales on the pool's online and bulk streams, plus the TriggerAuthentication that
gives KEDA the Redis address and password from a Secret. `conveyor render keda` writes them.
On a Redis/Valkey Cluster (`CONVEYOR_REDIS_CLUSTER`, or `--redis-cluster`) the stream triggers
are `redis-cluster-streams`, and KEDA reads the nodes' `addresses` instead of one `address`: each
partition's streams carry its hash tag, so KEDA's cluster client finds the master that holds them.

Trigger design: `streamLength` (XLEN) on both lanes. Workers XACK and XDEL an entry in one round
trip, so XLEN counts queued plus in-flight work: one queued job wakes a pool from zero, and a
long batch keeps its replicas until it is acknowledged. `lagCount` is left out: XDEL leaves
tombstones ahead of the group's position whenever jobs finish out of order, Redis then answers
`lag: nil`, and KEDA reads that as -1 (no work) while work is waiting.

A model with `autoscaling.metric: backlog_seconds` scales instead on seconds of work (one
trigger on its scaling seconds, shared/backlog.py: the backlog, at most `target_s` per job),
read by KEDA's `metrics-api` scaler from the producer's `/metrics/backlog/{model}/{variant}`
(`scaling_seconds`) or by its `prometheus` scaler (`conveyor_backlog_scaling_seconds`).

The stream triggers carry what KEDA cannot learn from the Secret's `address`: the database the
URL names (`databaseIndex`; without it KEDA reads DB 0, sees no stream and holds the pools at
their minimum) and TLS for a `rediss://` URL (`enableTLS`; `unsafeSsl` too where its
`ssl_cert_reqs=none` has the pods skip the certificate check). The password never goes in: KEDA
reads it from the Secret through the TriggerAuthentication, and a private CA or client
certificate the URL makes the pods read from the Secret that `--redis-tls-secret` names."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml
from redis.connection import SSLConnection, parse_url

from autoscaling.prometheus_url import PROMETHEUS_URL
from shared.keys import Keys
from shared.model_repository import ModelConfig, ModelConfigError, ModelRepository

API_VERSION = "keda.sh/v1alpha1"
AUTH_NAME = "conveyor-redis"  # the TriggerAuthentication
# Secret keys: address (host:port) or, for a cluster, addresses (host:port,...); password; url
# (CONVEYOR_REDIS_URL, for the pods).
SECRET_NAME = "conveyor-redis"
STREAMS_SCALER = "redis-streams"
CLUSTER_STREAMS_SCALER = "redis-cluster-streams"
# On every ScaledObject: the scaler its triggers use, so an overlay can select the stream-scaled
# pools (k8s/overlays/prod-cluster switches them to the cluster scaler).
SCALER_LABEL = "conveyor.dev/scaler"
WORKER_PREFIX = "worker"
PART_OF = "conveyor"
_DNS_LABEL_MAX = 63
# KEDA names a ScaledObject's HPA `keda-hpa-<name>`, which its admission webhook holds to 63
# characters (a DNS label; kedacore/keda#7762): a longer pool name had `kubectl apply` refused.
HPA_PREFIX = "keda-hpa-"
_SCALED_OBJECT_MAX = _DNS_LABEL_MAX - len(HPA_PREFIX)
_HPA_MAX_WINDOW_S = 3600  # the HPA rejects longer stabilization windows
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
DEFAULT_NAMESPACE = "conveyor"  # where the URLs and queries of a render without one point
# Keys of the Secret `--redis-tls-secret` names (a `kubernetes.io/tls` Secret, cert-manager's).
TLS_SECRET_KEYS = {"ca": "ca.crt", "cert": "tls.crt", "key": "tls.key"}


def dns_label(*parts: str, max_len: int = _DNS_LABEL_MAX) -> str:
    """Join parts into an RFC 1123 label of at most `max_len`; names that had to change
    (`.`/`_`, length) get a short hash of the original so two pools never collapse onto one
    name (`v1.2` vs `v1_2`)."""
    raw = "-".join(parts)
    clean = _NOT_DNS.sub("-", raw.lower()).strip("-")
    clean = re.sub(r"-{2,}", "-", clean)
    if clean == raw and len(clean) <= max_len:
        return clean
    digest = hashlib.sha256(raw.encode()).hexdigest()[:6]
    return f"{clean[: max_len - 7].rstrip('-')}-{digest}"


def worker_name(model: str, variant: str) -> str:
    """Name shared by a pool's Deployment and its ScaledObject: short enough for the HPA KEDA
    names after it."""
    return dns_label(WORKER_PREFIX, model, variant, max_len=_SCALED_OBJECT_MAX)


@dataclass(frozen=True, slots=True)
class MetricSources:
    """Where KEDA reads backlog seconds: the producers' Service (metrics-api; no API key, like
    `/metrics`) or a Prometheus server that scrapes them."""

    producer_url: str = "http://producer.conveyor.svc"
    prometheus_url: str = PROMETHEUS_URL

    @classmethod
    def for_namespace(cls, namespace: str | None) -> MetricSources:
        return cls(producer_url=f"http://producer.{namespace or DEFAULT_NAMESPACE}.svc")


class RedisTargetError(ValueError):
    """CONVEYOR_REDIS_URL asks for TLS that KEDA's scaler cannot be given as rendered."""


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """What of CONVEYOR_REDIS_URL KEDA needs besides the Secret's address and password: its
    database, whether it is TLS, whether it names an ACL user (whose name KEDA then reads
    from the Secret's `username`; the values themselves never go into the manifest), whether
    its TLS skips the certificate check (`ssl_cert_reqs=none`, a self-signed server), and which
    of KEDA's TLS parameters (`ca`, `cert`, `key`) it reads from the Secret `tls_secret`."""

    db: int = 0
    tls: bool = False
    user: bool = False
    unverified: bool = False
    tls_secret: str | None = None
    tls_files: tuple[str, ...] = ()

    @classmethod
    def of_url(cls, url: str, tls_secret: str | None = None) -> RedisTarget:
        """Raises RedisTargetError for TLS KEDA would fail every handshake of: files the pods
        read (a private CA, a client certificate) with no Secret to hand KEDA them, or a
        hostname check skipped alone, which KEDA's scaler cannot do."""
        parsed = parse_url(url)
        tls = parsed.get("connection_class") is SSLConnection
        unverified = tls and parsed.get("ssl_cert_reqs") == "none"  # redis-py's spelling only
        if tls and not unverified and parsed.get("ssl_check_hostname") is False:
            raise RedisTargetError(
                "CONVEYOR_REDIS_URL has ssl_check_hostname=false, and KEDA's redis scaler cannot "
                "skip the hostname check alone (it would fail every handshake): give Redis a "
                "certificate naming the Secret's address and drop ssl_check_hostname, or skip "
                "certificate checks altogether with ssl_cert_reqs=none (KEDA's unsafeSsl)"
            )
        files = _tls_files(parsed) if tls else ()
        if unverified:
            files = tuple(f for f in files if f != "ca")  # unsafeSsl checks no chain
        if files and tls_secret is None:
            raise RedisTargetError(
                f"CONVEYOR_REDIS_URL names TLS files KEDA cannot read from the pods "
                f"({', '.join(files)}): pass --redis-tls-secret NAME, a Secret in the "
                f"ScaledObjects' namespace holding "
                f"{', '.join(TLS_SECRET_KEYS[f] for f in files)} (a kubernetes.io/tls Secret)"
            )
        if tls_secret is not None and not files:
            raise RedisTargetError(
                "--redis-tls-secret: CONVEYOR_REDIS_URL is not rediss:// with ssl_ca_certs or "
                "ssl_certfile, so KEDA has nothing to read from that Secret"
            )
        user = bool(parsed.get("username"))
        return cls(int(parsed.get("db") or 0), tls, user, unverified, tls_secret, files)

    def metadata(self, cluster: bool) -> dict[str, str]:
        """The triggers' connection metadata: a cluster has database 0 only. A certificate the
        pods take unchecked KEDA must too (`unsafeSsl`): it verified it, failed every handshake
        with a self-signed server, and scaled no pool."""
        found = {} if cluster or not self.db else {"databaseIndex": str(self.db)}
        found |= {"enableTLS": "true"} if self.tls else {}
        return found | ({"unsafeSsl": "true"} if self.unverified else {})


def streams_scaler(cluster: bool) -> str:
    """KEDA's scaler for Redis Streams on one server, or on a cluster."""
    return CLUSTER_STREAMS_SCALER if cluster else STREAMS_SCALER


def pool_scaler(config: ModelConfig, cluster: bool) -> str:
    """The scaler a pool's triggers use (the value of SCALER_LABEL)."""
    if config.autoscaling.metric == "backlog_seconds":
        return config.autoscaling.backlog.scaler
    return streams_scaler(cluster)


def pool_triggers(
    config: ModelConfig,
    variant: str,
    keys: Keys,
    sources: MetricSources | None = None,
    cluster: bool = False,
    redis: RedisTarget = RedisTarget(),
    namespace: str | None = None,
) -> list[dict[str, Any]]:
    """One `streamLength` trigger per lane, both scaling on the model's lag_per_replica, on
    `redis`'s database; or, for `metric: backlog_seconds`, one trigger on the pool's seconds of
    backlog in `namespace`."""
    hints = config.autoscaling
    if hints.metric == "backlog_seconds":
        return [backlog_trigger(config, variant, sources or MetricSources(), namespace)]
    lanes = (
        ("online", keys.queue(config.name, variant)),
        ("bulk", keys.bulk_queue(config.name, variant)),
    )
    return [
        {
            "type": streams_scaler(cluster),
            "name": lane,
            "metricType": "AverageValue",
            "metadata": {
                "stream": stream,
                "streamLength": str(hints.lag_per_replica),
                "activationLagCount": str(hints.activation_lag),
                **redis.metadata(cluster),
            },
            "authenticationRef": {"name": AUTH_NAME},
        }
        for lane, stream in lanes
    ]


def backlog_trigger(
    config: ModelConfig, variant: str, sources: MetricSources, namespace: str | None = None
) -> dict[str, Any]:
    """Active above 0 s (one queued job wakes the pool); AverageValue `target_s` per replica.
    A base URL's trailing `/` is dropped: KEDA sends `…//metrics/backlog/…` as written, and the
    producer answers that path 404. The Prometheus query keeps to the pool's namespace (the
    `namespace` label scraped pods carry): dev and prod seen by one Prometheus shared a backlog,
    and each scaled on the larger one."""
    backlog = config.autoscaling.backlog
    target = f"{backlog.target_s:.15g}"  # as written: `:g` kept six digits (1234.57)
    if backlog.scaler == "prometheus":
        # Every producer reports the same value (it is read from Redis): take one. The
        # namespace comes first: the dev overlay rewrites it as the query's second `"` field.
        labels = f'namespace="{namespace or DEFAULT_NAMESPACE}",'
        labels += f'model="{config.name}",variant="{variant}"'
        query = f"max(conveyor_backlog_scaling_seconds{{{labels}}})"
        metadata = {
            "serverAddress": sources.prometheus_url.rstrip("/"),
            "query": query,
            "threshold": target,
            "activationThreshold": "0",
        }
    else:
        metadata = {
            "url": f"{sources.producer_url.rstrip('/')}/metrics/backlog/{config.name}/{variant}",
            "valueLocation": "scaling_seconds",
            "targetValue": target,
            "activationTargetValue": "0",
        }
    return {
        "type": backlog.scaler,
        "name": "backlog",
        "metricType": "AverageValue",
        "metadata": metadata,
    }


def scaled_object(
    config: ModelConfig,
    variant: str,
    keys: Keys,
    namespace: str | None = None,
    sources: MetricSources | None = None,
    cluster: bool = False,
    redis: RedisTarget = RedisTarget(),
) -> dict[str, Any]:
    """The ScaledObject for one pool; its target is the Deployment of the same name."""
    hints = config.autoscaling
    name = worker_name(config.name, variant)
    metadata = _metadata(name, namespace, model=config.name, variant=variant)
    metadata["labels"][SCALER_LABEL] = pool_scaler(config, cluster)
    return {
        "apiVersion": API_VERSION,
        "kind": "ScaledObject",
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "pollingInterval": hints.polling_interval_s,
            "cooldownPeriod": hints.cooldown_s,
            "minReplicaCount": hints.min_replicas,
            "maxReplicaCount": max(hints.max_replicas, hints.min_replicas),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(config)}},
            "triggers": pool_triggers(
                config,
                variant,
                keys,
                sources or MetricSources.for_namespace(namespace),
                cluster,
                redis,
                namespace,
            ),
        },
    }


def trigger_authentication(
    namespace: str | None = None, cluster: bool = False, redis: RedisTarget = RedisTarget()
) -> dict[str, Any]:
    """KEDA reads the Redis address (`addresses` of a cluster's nodes, any subset: the client
    discovers the rest), `password` and, for a URL naming an ACL user, `username` for every
    stream trigger from one Secret (without it KEDA authenticated as the default user with the
    ACL user's password, refused, and scaled nothing); a private CA and a client certificate
    from `redis.tls_secret`."""
    address = "addresses" if cluster else "address"
    names = (address, "password", *(("username",) if redis.user else ()))
    refs = [{"parameter": p, "name": SECRET_NAME, "key": p} for p in names]
    # KEDA's `tls` parameter would clash with the triggers' `enableTLS`: only the files here.
    refs += [
        {"parameter": f, "name": redis.tls_secret, "key": TLS_SECRET_KEYS[f]}
        for f in redis.tls_files
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "TriggerAuthentication",
        "metadata": _metadata(AUTH_NAME, namespace),
        "spec": {"secretTargetRef": refs},
    }


def render(
    repository: ModelRepository,
    keys: Keys,
    namespace: str | None = None,
    sources: MetricSources | None = None,
    cluster: bool = False,
    redis: RedisTarget = RedisTarget(),
) -> list[dict[str, Any]]:
    """TriggerAuthentication first, then one ScaledObject per (model, variant), sorted."""
    pools = [
        (config, v)
        for config in sorted(repository, key=lambda c: c.name)
        for v in sorted(config.variants)
    ]
    _check_unique(pools)
    return [trigger_authentication(namespace, cluster, redis)] + [
        scaled_object(config, v, keys, namespace, sources, cluster, redis) for config, v in pools
    ]


# A plain scalar Go's YAML reads as a number, once stripped of every `_` (go-yaml's resolve.go
# removes them before strconv.ParseInt, base 0: 0x, 0b, 0o, a leading 0; or its float syntax).
_GO_NUMBER = re.compile(
    r"[-+]?(?:0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO][0-7]+"
    r"|(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?)"
)
_STR_TAG, _FLOAT_TAG = "tag:yaml.org,2002:str", "tag:yaml.org,2002:float"


class _KubeDumper(yaml.SafeDumper):
    """Quotes the strings Go's YAML (kubectl, kustomize) reads as numbers or booleans and PyYAML's
    YAML 1.1 does not (`1e3`, `2_5e1`, `0o17`, `0_x1f`, `y`, `n`): a model named `1e3` rendered
    a label kubectl refused as a number, one named `y` a label it refused as `true`. Quoting a
    string that needs none changes nothing."""

    def resolve(self, kind: type[yaml.Node], value: Any, implicit: tuple[bool, bool]) -> str:
        """A string Go reads as a number is tagged as one, so the emitter quotes it: underscores
        anywhere (`0_x1f`, `0e_-1`) were beyond a regex over the string as written."""
        tag = super().resolve(kind, value, implicit)
        if tag != _STR_TAG or kind is not yaml.ScalarNode or not implicit[0]:
            return tag
        return _FLOAT_TAG if _GO_NUMBER.fullmatch(value.replace("_", "")) else tag


_KubeDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^[yYnN]$"), list("yYnN"))


def to_yaml(objects: Iterable[dict[str, Any]]) -> str:
    """Multi-document YAML with a header saying the file is generated."""
    header = "# Generated by `conveyor render keda` from model_repository/ — do not edit.\n"
    body = yaml.dump_all(
        list(objects),
        Dumper=_KubeDumper,
        sort_keys=False,
        explicit_start=True,
        width=100,
    )
    return header + body


def _behavior(config: ModelConfig) -> dict[str, Any]:
    """Scale-down waits `cooldown_s` (KEDA's cooldown only covers 1 → 0) and removes one pod at
    a time, so a draining worker is never joined by many others at once."""
    return {
        "scaleDown": {
            "stabilizationWindowSeconds": min(config.autoscaling.cooldown_s, _HPA_MAX_WINDOW_S),
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
        }
    }


def _metadata(
    name: str, namespace: str | None, model: str | None = None, variant: str | None = None
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/managed-by": "conveyor"}
    if model is not None and variant is not None:
        # Label values must end alphanumeric; model names may end in `-`, `.` or `_`.
        labels |= {
            "conveyor.dev/model": model.rstrip("-._"),
            "conveyor.dev/variant": variant.rstrip("-._"),
        }
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if namespace:
        meta["namespace"] = namespace
    return meta


def _tls_files(parsed: dict[str, Any]) -> tuple[str, ...]:
    """KEDA's TLS parameters the URL's files stand for: a CA (file, folder or PEM) and a client
    certificate with its key."""
    ca = any(parsed.get(k) for k in ("ssl_ca_certs", "ssl_ca_path", "ssl_ca_data"))
    client = bool(parsed.get("ssl_certfile"))
    return (*(("ca",) if ca else ()), *(("cert", "key") if client else ()))


def _check_unique(pools: list[tuple[ModelConfig, str]]) -> None:
    """Refuse two pools whose names join to one (`a-b:c` and `a:b-c`: `worker-a-b-c`): applied,
    one's objects replace the other's and that pool never scales. A repository error, so the
    CLI says it in one line (it was a traceback)."""
    seen: dict[str, str] = {}
    for config, variant in pools:
        name, pool = worker_name(config.name, variant), f"{config.name}:{variant}"
        if name in seen:
            raise ModelConfigError(
                f"pools {seen[name]} and {pool} both render the object name {name}: rename one"
            )
        seen[name] = pool

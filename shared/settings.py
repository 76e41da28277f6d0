"""Process configuration from `CONVEYOR_*` environment variables, read once per process."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.cpu_count import usable_cpus
from shared.http_url import is_http_url
from shared.limits import MAX_PROCESSES
from shared.model_names import NAME_PATTERN

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
VISIBLE_ASCII = "[!-~]"  # a character class: ASCII without spaces or control characters
PRINTABLE = re.compile(f"{VISIBLE_ASCII}*")  # fullmatch: `$` let a final newline through
# `scheme://user:password@`: a URL's userinfo up to its password (a literal `@` in one is %40)
URL_PASSWORD = re.compile(r"(://[^:/@\s,]*:)[^/@\s,]*@")
# A token bucket's bounds (shared/rate_limit.py), for the defaults here and a key's own: its
# refill time (burst / rate, at most 10^18 ms) must stay an integer Redis takes as a PEXPIRE,
# and its tokens whole numbers a double holds exactly.
MIN_RATE_PER_S = 1e-6  # a token every 11.6 days
MAX_BURST = 1_000_000_000
# Longest wait a thread's or socket's timeout is given (a year): past threading.TIMEOUT_MAX
# (292 years) Python raises OverflowError, as it did for `inf`; a sum of a few stays below it.
MAX_TIMEOUT_S = 31_536_000
# Longest TTL a key is given (a century, a batch's window added on top): past 2^63 ms Redis
# refuses the EXPIRE, and a TTL that large was accepted, then failed every submit.
MAX_TTL_S = 3_153_600_000
# gc.set_threshold takes a C int: a larger one raised OverflowError as the process began to serve.
MAX_GC_THRESHOLD = 2**31 - 1
# Settings a refusal names without their value: its line goes to a terminal or a pod's log.
SECRET_FIELDS = ("dev_api_key", "console_secret", "webhook_secret", "webhook_previous_secret")
# A CONVEYOR_ALLOWED_HOSTS entry: a name, or `.` and a domain (its subdomains too).
HOST_ENTRY = re.compile(r"\.?[\w-]+(\.[\w-]+)*\.?", re.ASCII)
# Values a user writes whole, where surrounding whitespace could only be a mistake (a key prefix
# and an instance id refuse any, and numbers, booleans and lists ignore it).
UNTRIMMED_FIELDS = ("model_repository", "artifact_dir", "state_dir", "host", *SECRET_FIELDS)


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def valid_key_prefix(value: str) -> str:
    """CONVEYOR_KEY_PREFIX's rule, `conveyor render keda --key-prefix`'s too: a brace would move
    every key's hash tag (shared/keys.py), scattering what one script touches over a cluster's
    slots. Empty (a script's unset variable) it was no default: a process given it used other
    keys than its peers, and never saw their jobs."""
    if not value:
        raise ValueError("must not be empty: unset it for the default, cv:")
    if not PRINTABLE.fullmatch(value) or "{" in value or "}" in value:
        raise ValueError("must be printable ASCII without spaces or braces")
    return value


def _parse_url(url: str) -> dict[str, Any]:
    """redis-py's own reading of a Redis URL. Imported here, when a URL is checked: importing
    redis (a third of a second) was a cost of every `conveyor` command, most of which never
    connect to Redis."""
    from redis.connection import parse_url

    return parse_url(url)


def _host_port(address: str) -> tuple[str, int]:
    try:
        parts = urlsplit(f"//{address}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or not port or parts.netloc != address or "@" in address:
        raise ValueError(f"{address!r} is no host:port (an IPv6 host as [::1]:7000)")
    return host, port


class Settings(BaseSettings):
    """Every knob of the producer and the workers; README documents each one."""

    # Numbers are finite: `inf` overflowed where a time became a lock's timeout
    # (CONVEYOR_SHUTDOWN_GRACE_S), and NaN was refused as if out of range.
    model_config = SettingsConfigDict(env_prefix="CONVEYOR_", extra="ignore", allow_inf_nan=False)

    # A default is not validated (pydantic-settings' validate_default) where its check imports
    # a heavy module (redis, the model repository) for every process, every `conveyor` command:
    # it is valid as written.
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", validate_default=False)
    # `redis_url` names any node of a Redis/Valkey Cluster (shared/redis_client.py).
    redis_cluster: bool = False
    # More nodes of that cluster (`host:port,host:port`), tried before `redis_url`'s to read
    # the topology: a process starts while any of them serves. The URL keeps credentials,
    # TLS and options for every node.
    redis_cluster_nodes: Annotated[list[tuple[str, int]], NoDecode] = Field(default_factory=list)
    # Replicas that must hold an accepted job (and a written result) before the producer
    # answers 202 (and before the worker tells the waiting producer): WAIT N after the write.
    # 0: answer once the master has it (a failover may lose the last writes).
    replica_acks: int = Field(default=0, ge=0)
    key_prefix: Annotated[str, AfterValidator(valid_key_prefix)] = "cv:"
    model_repository: Path = Path("model_repository")
    artifact_dir: Path = Path("var/models")
    models: Annotated[list[str], NoDecode] = Field(default_factory=list, validate_default=False)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65_535)
    instance_id: str = Field(default_factory=_default_instance_id)
    max_body_bytes: int = Field(default=1_048_576, ge=1)
    # Bodies of batch input (`POST /v1/files`, `POST /v1/batches`): 10,000 lines of embedding
    # requests alone pass 1 MiB. Each is held whole in the producer while it is read and stored.
    max_upload_bytes: int = Field(default=104_857_600, ge=1)
    # Bytes of `/v1/files` uploads a tenant may hold at once (they live the result TTL): a loop
    # of uploads would otherwise fill Redis to its maxmemory, every tenant's submits then 503s.
    max_file_bytes_per_tenant: int = Field(default=1_073_741_824, ge=1)
    # Non-blank lines a Batch API batch may hold (OpenAI's cap): each refused line is an
    # errors-file record kept for the window and the result TTL, so a 1 MiB body of one-byte
    # lines would keep ~80 MB in Redis for one request.
    max_batch_lines: int = Field(default=50_000, ge=1)
    # Request boundary (producer_api/request_boundary.py): deepest JSON nesting accepted.
    max_json_depth: int = Field(default=64, ge=2)
    # Longest wait on Redis for one command, a connection or a free pooled connection.
    redis_timeout_s: float = Field(default=2.0, gt=0, le=MAX_TIMEOUT_S)
    max_wait_s: float = Field(default=60.0, gt=0)
    result_ttl_s: int = Field(default=86_400, ge=1, le=MAX_TTL_S)
    # An LLM job's token stream once its final event is written (its text lives on in the
    # job's result); never longer than `result_ttl_s`. While written, it keeps `result_ttl_s`.
    token_stream_ttl_s: int = Field(default=600, ge=1, le=MAX_TTL_S)
    log_level: str = "INFO"

    # API keys (shared/api_keys.py); `disabled` serves everyone as tenant "default" (local use).
    auth: Literal["enabled", "disabled"] = "enabled"
    dev_api_key: str = ""
    # With auth disabled, the Host names served besides loopback ones (`localhost`,
    # `*.localhost`), IP literals and `host`: any other Host is refused 400, so a web page that
    # points its own name at 127.0.0.1 (DNS rebinding) cannot drive the producer from the
    # user's browser (producer_api/request_boundary.py).
    # Exact names, case-insensitive; `.example.com` allows its subdomains too, `*` every Host.
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # The producer's address as clients reach it (`https://api.example.com`, or under a path
    # prefix `https://example.com/conveyor`): the base of every link it hands out (a job's or
    # batch's `urls` and `Location`, a batch webhook event's `urls`). Empty: links are built
    # from each request's Host, which a client or a proxy in front chooses.
    public_url: str = ""
    # Peers whose X-Forwarded-For and X-Forwarded-Proto `conveyor up`'s producers believe
    # (uvicorn's `forwarded_allow_ips`, its default here): addresses or networks, or `*` for any
    # peer. Behind an ingress or load balancer, its addresses: without them every request
    # came from the proxy's address, and one client's failed console logins locked out all.
    forwarded_allow_ips: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1", "::1"]
    )
    # `conveyor up`'s logs, embedded Valkey data, dev key and stack.json (read by the CLI).
    state_dir: Path = Path("var/run")
    # `conveyor up`'s producer processes on its one port: a quarter of the CPUs it may use (at
    # least one), since workers (the models) and Redis need the rest (README "Sizing a
    # deployment"). Those it may use: a container's CPU limit, not the host's cores.
    producer_processes: int = Field(
        default_factory=lambda: min(MAX_PROCESSES, max(1, usable_cpus() // 4)),
        ge=1,
        le=MAX_PROCESSES,
    )
    # Per-key defaults; a key may carry its own (`conveyor keys create --rate ...`).
    # within a bucket's bounds: a rate of 1e-16 answered every request 500
    rate_limit_per_s: float = Field(default=100.0, ge=MIN_RATE_PER_S)
    rate_limit_burst: int = Field(default=200, ge=1, le=MAX_BURST)
    max_in_flight: int = Field(default=1_000, ge=1)
    # Job-event streams (`GET /v1/jobs/{id}/events`) one key may hold open at once: each reads
    # Redis about once a second while its job is queued, and holds a socket on a producer.
    max_streams_per_key: int = Field(default=100, ge=1)
    # How soon an open stream (job events, OpenAI) or console live feed notices that its API key
    # was revoked or expired or its session ended: each looks again this often (a job-event
    # stream's place among its key's streams is renewed then too).
    stream_recheck_s: float = Field(default=5.0, gt=0, le=MAX_TIMEOUT_S)
    # How long a streamed OpenAI request waits for its job's first event before its headers
    # are sent (a failure by then is the request's 4xx, after it an error chunk); its
    # keep-alive ping period too.
    stream_first_event_s: float = Field(default=15.0, gt=0, le=MAX_TIMEOUT_S)
    # How long a stopping producer (conveyor/producer_server.py: `conveyor up`, compose,
    # Kubernetes, the image) lets its requests in flight finish before cutting them (uvicorn's
    # `timeout_graceful_shutdown`, whole seconds); `conveyor up` kills a producer only past it.
    producer_shutdown_grace_s: int = Field(default=25, ge=1, le=MAX_TIMEOUT_S)
    # How long a producer keeps an idle connection open (uvicorn's `timeout_keep_alive`): past
    # the 60 s for which ingress-nginx and cloud load balancers reuse one, else a request they
    # sent as the producer closed it got a 502 (uvicorn's own 5 s did that).
    keep_alive_s: int = Field(default=75, ge=1, le=MAX_TIMEOUT_S)
    # How long a producer waits for a request's line and headers once their first bytes came
    # (conveyor/producer_server.py), nginx's `client_header_timeout`: past it, 408 and closed.
    request_head_timeout_s: float = Field(default=60.0, gt=0, le=MAX_TIMEOUT_S)
    # How long a stopping producer (SIGTERM) lets its open streams (job events, OpenAI, console
    # live feeds) say goodbye before cutting them, and after how long its waiting requests
    # (long-polls, submit-and-wait, whole OpenAI answers) answer with what they have
    # (producer_api/draining.py). Below the producer's graceful shutdown (`_stream_grace`) and
    # well inside any orchestrator's kill timeout (Kubernetes: 30 s): past them, waits are reset
    # rather than answered.
    stream_shutdown_grace_s: float = Field(default=3.0, gt=0, le=MAX_TIMEOUT_S)

    # Signs the operator console's session cookies (producer_api/console/session.py); empty:
    # a random secret per process (sessions then end when the producer restarts, and each
    # replica needs its own login).
    console_secret: str = ""
    # Failed console logins one client address (an IPv6 /64) may make a minute, every producer
    # counting together; past them its logins get 429 until the minute ends.
    console_login_failures_per_minute: int = Field(default=10, ge=1)
    # A console session unused this long ends (an open page's live feed uses it); at most
    # its cookie's 12 hours.
    console_idle_timeout_s: int = Field(default=1_800, ge=60, le=12 * 3_600)

    webhook_allowlist: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Host names of the operator's own receivers that may resolve to private addresses (an
    # in-cluster Service): matched exactly, never by a `*.` rule, since any other name is the
    # tenant's to point at the workers' network (workers/webhook_delivery.py).
    webhook_internal_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    webhook_secret: str = ""
    # The secret before a rotation: while set, each delivery is signed with the owner's key from
    # both, so a receiver still holding its old key verifies until it has the new one.
    webhook_previous_secret: str = ""
    webhook_retry_for_s: float = Field(default=3_600.0, ge=0, le=MAX_TTL_S)
    # At most 5 minutes: an attempt's claim lives the timeout and a minute more
    # (workers/webhook_delivery.py), and must lapse before kombu restores a dead worker's
    # attempt (shared/celery_broker.VISIBILITY_TIMEOUT_S, 15 minutes), or that copy finds it
    # and drops the delivery as a duplicate.
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=300)
    # Deliveries one worker runs at once, each on a thread of Celery's pool (workers/app.py):
    # a receiver answering slowly but in time holds one of them, not every other tenant's
    # (1: the solo pool, one at a time).
    webhook_concurrency: int = Field(default=4, ge=1, le=64)

    metrics_port: int = Field(default=9_100, ge=0, le=65_535)
    # Garbage collection once a process serves (shared/heap_tuning.py): start-up's objects
    # frozen out of every collection, and young collections every this many net allocations
    # (CPython's default is 700).
    gc_freeze: bool = True
    gc_young_threshold: int = Field(default=10_000, ge=1, le=MAX_GC_THRESHOLD)
    # A worker's heartbeat (shared/worker_registry.py): it beats every this many seconds, and its
    # record expires this long after its last beat (whole seconds, an EXPIRE's): only then do the
    # producer, the console and the autoscaler read a killed worker as gone. The TTL must exceed
    # the period (`_heartbeat_ttl`), or a live worker's record lapsed between its beats.
    worker_heartbeat_s: float = Field(default=2.0, gt=0, le=MAX_TIMEOUT_S)
    worker_heartbeat_ttl_s: int = Field(default=10, ge=1, le=MAX_TTL_S)
    # 0 would be BLOCK 0: wait forever, and never notice a stop.
    block_ms: int = Field(default=1_000, ge=1, le=MAX_TIMEOUT_S * 1_000)
    shutdown_grace_s: float = Field(default=30.0, ge=0, le=MAX_TIMEOUT_S)
    # Past the grace (or a crash, or a start given up): what an engine's close that overran its
    # share and Celery's own exit get before a worker's exit is forced, and before `conveyor up`
    # and `conveyor autoscale` kill a worker they stopped.
    forced_exit_margin_s: float = Field(default=20.0, gt=0, le=MAX_TIMEOUT_S)
    # A worker whose resident memory (its engines' processes included) passes this many MiB is
    # recycled as Celery's worker_max_memory_per_child does: drained, then exits 75 to be
    # restarted (workers/runtime/memory_ceiling.py). 0: no ceiling.
    worker_max_memory_mb: int = Field(default=0, ge=0)
    # `conveyor up`: how long a child may take to be ready (a large LLM's load takes minutes).
    start_timeout_s: float = Field(default=300.0, gt=0)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        """redis-py's own error names no setting, and surfaces only once a process connects: a
        traceback from each command. A database path that is no number it drops in silence,
        using database 0."""
        if not value.startswith(REDIS_SCHEMES):
            raise ValueError(f"must start with one of {', '.join(REDIS_SCHEMES)}")
        try:
            options = _parse_url(value)
        except ValueError as exc:
            raise ValueError(str(exc).rstrip(".")) from None
        database = "" if value.startswith("unix://") else urlsplit(value).path.strip("/")
        if database and not database.isdigit():
            raise ValueError(f"database {database!r} is not a number (redis://host:port/0)")
        if options.get("port") == 0:
            raise ValueError("port 0 is no port a server listens on")
        if options.get("db", 0) < 0:
            raise ValueError("a database is numbered from 0")
        return value

    @field_validator("redis_cluster")
    @classmethod
    def _cluster_database(cls, cluster: bool, info: ValidationInfo) -> bool:
        """A cluster has database 0 only: redis-py's RedisCluster refuses any other as each
        process connects, with a traceback."""
        url = info.data.get("redis_url")  # absent when it was refused itself
        if cluster and url is not None and (database := _parse_url(url).get("db", 0)):
            raise ValueError(f"a cluster has database 0 only; CONVEYOR_REDIS_URL names {database}")
        return cluster

    @field_validator("worker_heartbeat_ttl_s")
    @classmethod
    def _heartbeat_ttl(cls, ttl_s: int, info: ValidationInfo) -> int:
        """A record that expires before the next beat rewrites it: a live worker read as gone
        between its beats (no consumer for its partitions, `scaling` events, autoscaling)."""
        period = info.data.get("worker_heartbeat_s")  # absent when it was refused itself
        if period is not None and ttl_s <= period:
            raise ValueError(
                f"must be longer than CONVEYOR_WORKER_HEARTBEAT_S ({period:g} s): a worker's"
                " record would expire between its beats"
            )
        return ttl_s

    @field_validator("stream_shutdown_grace_s")
    @classmethod
    def _stream_grace(cls, grace_s: float, info: ValidationInfo) -> float:
        """Streams and waits end within the graceful shutdown, or uvicorn cuts them first: their
        clients got a reset where a goodbye or the job as it stands was meant."""
        shutdown_s = info.data.get("producer_shutdown_grace_s")  # absent when it was refused
        if shutdown_s is not None and grace_s >= shutdown_s:
            raise ValueError(
                f"must be below CONVEYOR_PRODUCER_SHUTDOWN_GRACE_S ({shutdown_s} s): the producer"
                " would cut its streams and waits before they end"
            )
        return grace_s

    @field_validator("model_repository", "artifact_dir", "state_dir", "host", mode="before")
    @classmethod
    def _not_empty(cls, value: object, info: ValidationInfo) -> object:
        """An empty value (a script's unset variable) was no default: a path became the current
        directory (`up`'s lock, logs and Valkey data there), a host every interface."""
        if isinstance(value, str) and not value.strip():
            meant = "0.0.0.0 for every interface" if info.field_name == "host" else "'.' here"
            raise ValueError(f"must not be empty: unset it for the default, or name {meant}")
        return value

    @field_validator(*UNTRIMMED_FIELDS, mode="before")
    @classmethod
    def _trimmed(cls, value: object) -> object:
        """A secret file's final newline (`kubectl create secret --from-file`) was kept: a path or
        host ending in one named another, a secret was not the one its peers or a webhook's
        receivers hold, a development key could never be sent. An empty one is `_not_empty`'s."""
        if isinstance(value, str) and value.strip() and value != value.strip():
            raise ValueError("must not begin or end with whitespace (a secret file's newline?)")
        return value

    @field_validator("instance_id")
    @classmethod
    def _instance_id(cls, value: str) -> str:
        """It names the producer's Redis connections, and CLIENT SETNAME refuses spaces: every
        connection would fail."""
        if not value or len(value) > 128 or not PRINTABLE.fullmatch(value):
            raise ValueError("must be 1 to 128 printable ASCII characters without spaces")
        return value

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        """Any name Python's logging knows (WARN too), checked here rather than when the first
        process configures its logging, after the others started."""
        names = logging.getLevelNamesMapping()
        if value.upper() not in names:
            raise ValueError(f"must be one of {', '.join(sorted(names))}")
        return value.upper()

    @field_validator("webhook_allowlist")
    @classmethod
    def _allowlist_entries(cls, entries: list[str]) -> list[str]:
        """An entry without a scheme or host matches no URL: every webhook would be refused as
        outside the list, with nothing saying the list itself is wrong."""
        if bad := [entry for entry in entries if not is_http_url(entry)]:
            raise ValueError(f"entry {bad[0]!r} is not http(s)://host[:port][/path-prefix]")
        return entries

    @field_validator("models")
    @classmethod
    def _model_selectors(cls, selectors: list[str]) -> list[str]:
        """A JSON list or a stray colon was taken as a model no repository has, refused only by
        a worker's bootstep as a traceback, and `model:` served every variant."""
        if bad := [s for s in selectors if not all(map(NAME_PATTERN.fullmatch, s.split(":", 1)))]:
            raise ValueError(f"entry {bad[0]!r} is not model or model:variant (comma-separated)")
        return selectors

    @field_validator(
        "models",
        "webhook_allowlist",
        "webhook_internal_hosts",
        "allowed_hosts",
        "forwarded_allow_ips",
        mode="before",
    )
    @classmethod
    def _split_lists(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("redis_cluster_nodes", mode="before")
    @classmethod
    def _cluster_nodes(cls, value: object) -> object:
        """`host:port` each (an IPv6 host bracketed), checked here: a seed redis-py cannot
        reach is skipped in silence, so a typo would surface only once the others are down."""
        if not isinstance(value, str):
            return value
        return [_host_port(part.strip()) for part in value.split(",") if part.strip()]

    @field_validator("redis_cluster_nodes")
    @classmethod
    def _nodes_of_a_cluster(
        cls, nodes: list[tuple[str, int]], info: ValidationInfo
    ) -> list[tuple[str, int]]:
        """Only a cluster's client reads them: without CONVEYOR_REDIS_CLUSTER=1 they were
        ignored in silence, and a single server's client on a cluster's node failed on MOVED."""
        if nodes and info.data.get("redis_cluster") is False:  # absent when it was refused
            raise ValueError("names a cluster's nodes: set CONVEYOR_REDIS_CLUSTER=1 with it")
        return nodes

    @field_validator("webhook_internal_hosts")
    @classmethod
    def _internal_hosts(cls, hosts: list[str]) -> list[str]:
        """Bare host names, as a URL's host reads (lower case): a scheme, port or pattern would
        match no receiver, and the receiver would be refused with nothing saying why."""
        if bad := [host for host in hosts if not re.fullmatch(r"[A-Za-z0-9.-]+", host)]:
            raise ValueError(f"entry {bad[0]!r} is not a bare host name (no scheme, port or *)")
        return [host.lower() for host in hosts]

    @field_validator("allowed_hosts")
    @classmethod
    def _allowed_hosts(cls, hosts: list[str]) -> list[str]:
        """Host names as a Host header names them, without its port: an entry with a scheme or
        port would match no request, and every one from that name would be refused."""
        if bad := [host for host in hosts if host != "*" and not HOST_ENTRY.fullmatch(host)]:
            raise ValueError(
                f"entry {bad[0]!r} is not a host name (no scheme or port; .example.com for its"
                " subdomains too, * for any)"
            )
        return [host.lower().rstrip(".") for host in hosts]  # `name.`: the same name

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _trusted_proxies(cls, entries: list[str]) -> list[str]:
        """uvicorn takes any other entry (a name, a network with host bits, `*` beside others)
        as text no peer's address equals: the proxy it meant was distrusted in silence."""
        if entries == ["*"]:
            return entries
        for entry in entries:
            try:
                ipaddress.ip_network(entry)
            except ValueError:
                raise ValueError(
                    f"entry {entry!r} is not an IP address or network (10.0.0.0/8), or * alone"
                ) from None
        return entries

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str) -> str:
        """A base every link is appended to: a query, fragment or password would be copied into
        each one, and a value without scheme or host gave links no client can follow."""
        if value and (
            not PRINTABLE.fullmatch(value) or not is_http_url(value) or set("?#@") & set(value)
        ):
            raise ValueError(
                "is not http(s)://host[:port][/path-prefix] (no credentials, query or fragment)"
            )
        return value.rstrip("/")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def masked_url(text: str) -> str:
    """`text` with each URL's password shown as `***`: lines naming a Redis URL go to terminals
    and pods' logs."""
    return URL_PASSWORD.sub(r"\1***@", text)


def _shown(error: ErrorDetails) -> str:
    """The refused value as written, a secret's left out."""
    return "***" if set(error["loc"]) & set(SECRET_FIELDS) else repr(error["input"])


def bad_setting(exc: ValidationError) -> str:
    """A Settings validation error in one line naming each variable, its value and why; a URL's
    password masked and a secret's value left out, since the line goes to a terminal or a pod's
    log."""
    problems = "; ".join(
        f"CONVEYOR_{'_'.join(map(str, e['loc'])).upper()}={_shown(e)}: {e['msg']}"
        for e in exc.errors()
    )
    return masked_url(f"bad setting: {problems}")


def settings_or_exit() -> Settings:
    """The settings, for a process's entry module (`uvicorn producer_api.app:app`, `celery -A
    workers.app`): a bad one ends it with one line naming the variable, as the CLI does, not a
    traceback naming the field."""
    try:
        return get_settings()
    except ValidationError as exc:
        if exc.title != Settings.__name__:
            raise
        raise SystemExit(f"Error: {bad_setting(exc)}") from None

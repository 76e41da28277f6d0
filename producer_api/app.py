"""The producer ASGI app (`uvicorn producer_api.app:app`): wires routers, error handlers, the
request boundary, and, in its one lifespan, builds every Redis-backed service once and starts
and stops the background loops in order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer_api.auth.rate_limit_headers import RateLimitHeadersMiddleware
from producer_api.batch_api.api_router import JSONL_UPLOADS
from producer_api.batch_api.api_router import router as batch_api_router
from producer_api.batch_api.progress import BatchApiProgress
from producer_api.batch_api.sweeper import BatchApiSweeper
from producer_api.canary.api_router import router as canary_router
from producer_api.console import Console, ConsoleHeadersMiddleware
from producer_api.console import router as console_router
from producer_api.draining import Draining
from producer_api.errors import install_error_handlers
from producer_api.events.api_router import router as events_router
from producer_api.events.serving import LAPSE_CHECKS
from producer_api.experiments.api_router import router as experiments_router
from producer_api.files.api_router import FILE_UPLOADS
from producer_api.files.api_router import router as files_router
from producer_api.health.api_router import router as health_router
from producer_api.health.startup import Startup, refuse_start
from producer_api.http_metrics import HttpMetricsMiddleware
from producer_api.jobs import admission
from producer_api.jobs.admission import Backpressure, IdempotencyKeys
from producer_api.jobs.api_router import router as jobs_router
from producer_api.jobs.group_commit import group_committing
from producer_api.metrics.api_router import router as metrics_router
from producer_api.models.api_router import router as models_router
from producer_api.openai.api_router import router as openai_router
from producer_api.periodic import Periodic
from producer_api.reply_listener import ReplyListener
from producer_api.request_boundary import BodyLimit, HostAllowList, RequestBoundaryMiddleware
from producer_api.routes.api_router import router as routes_router
from producer_api.state import ProducerState
from producer_api.token_hub import TokenHub
from producer_api.traffic_control import TrafficControl
from shared import job_scripts
from shared.api_keys import ApiKeyStore
from shared.batch_api_store import BatchApiStore
from shared.consumer_groups import ensure_groups_where_streams_fit
from shared.file_store import FileStore
from shared.heap_tuning import settle_heap
from shared.job_store import JobStore, merged_enqueues
from shared.keys import Keys, partition_tag
from shared.model_repository import ModelConfigError, ModelRepository
from shared.queue_eta import REFRESH_S as ETA_REFRESH_S
from shared.queue_eta import QueueEta
from shared.queue_position import QueuePositions
from shared.rate_limit import InFlightLimiter, RateLimiter, StreamLimiter
from shared.redis_client import CredentialsRefused, connect, preload
from shared.redis_clock import CLOCK, EVERY_S, ClockSkew
from shared.settings import Settings, get_settings, settings_or_exit
from shared.telemetry import configure_logging, configure_tracing
from shared.webhook_events import WebhookDispatcher

# Probes and scrapes, by path: OpenTelemetry searches the whole URL, Host included, so a bare
# "metrics" left every request to a producer served as metrics.example.com (or to a model
# named text-metrics) untraced. The path starts with uvicorn's --root-path, unknown here: any
# prefix may come before the probe, except one holding a route's own `/v1/<collection>/` or
# `/console/`, so a model or job named `metrics` keeps its span (`/v1/metrics/` is a root path
# ending in v1 before the scrape `/metrics/backlog/...`). The Host is matched possessively, so
# the look ahead runs once, not once per character of a long Host. No comma: it splits the list.
UNTRACED = (
    r"^[a-z]+://[^/]*+(?!.*/(v1/(?!metrics/)[^/]+|console)/)(/[^/]*)*/(healthz|readyz|metrics)(/|$)"
)


def _partition_streams(keys: Keys, repository: ModelRepository) -> list[str]:
    """Both lanes of every partition: their groups exist up front, so lag is measurable
    (KEDA) before any worker runs."""
    return [
        lane(config.name, variant)
        for config in repository
        for variant in config.variants
        for lane in (keys.queue, keys.bulk_queue)
    ]


def _partition_tags(repository: ModelRepository, kind: str | None = None) -> set[str]:
    """The hash tag of every partition (of models of `kind`, if given): whose reply channels
    the producer subscribes to, whose token streams its hub reads."""
    return {
        partition_tag(config.name, variant)
        for config in repository
        if kind in (None, config.kind)
        for variant in config.variants
    }


def build_state(settings: Settings, repository: ModelRepository | None = None) -> ProducerState:
    """Every service of the producer, built once (no I/O yet): each store and limiter holds the
    one Redis pool and registers its Lua scripts here, not per request. `repository`: the one
    already loaded from `settings.model_repository` (else it is loaded here)."""
    keys = Keys(settings.key_prefix)
    name = f"producer-{settings.instance_id}"
    client = connect(settings.redis_url, name=name, blocks_ms=0, cluster=settings.redis_cluster)
    # the submit path: one pipeline per loop turn, one ENQUEUE call per lane in it
    merges = {job_scripts.ENQUEUE: merged_enqueues}
    hot = group_committing(client, settings.redis_url, f"{name}-hot", merges)
    ttl_s = settings.result_ttl_s
    job_store = JobStore(hot, keys, ttl_s)
    batch_store = BatchApiStore(client, keys, ttl_s)
    webhooks = WebhookDispatcher(settings.redis_url)
    if repository is None:
        repository = ModelRepository.load(settings.model_repository, settings.result_ttl_s)
    replies = ReplyListener(client, keys, settings.instance_id, job_store)
    eta = QueueEta(client, QueuePositions(hot, keys), repository)
    return ProducerState(
        settings=settings,
        keys=keys,
        redis=client,
        committing_redis=hot,
        repository=repository,
        replies=replies,
        tokens=TokenHub(settings.redis_url, client, keys, settings.instance_id),
        job_store=job_store,
        batch_store=batch_store,
        batch_progress=BatchApiProgress(job_store, batch_store, webhooks, settings.public_url),
        file_store=FileStore(client, keys, ttl_s),
        api_keys=ApiKeyStore(hot, keys),
        rate_limiter=RateLimiter(hot, keys),
        in_flight=InFlightLimiter(hot, keys, ttl_s),
        open_streams=StreamLimiter(client, keys, LAPSE_CHECKS * settings.stream_recheck_s),
        idempotency=IdempotencyKeys(hot, keys, ttl_s),
        backpressure=Backpressure(hot, keys),
        queue_eta=eta,
        eta_refresher=Periodic("queue-eta", ETA_REFRESH_S, eta.refresh),
        webhooks=webhooks,
        traffic=TrafficControl.build(client, keys, settings, repository, job_store, webhooks),
        draining=Draining(replies, settings.stream_shutdown_grace_s),
        startup=Startup(),
    )


async def _redis_side_startup(state: ProducerState, skew: ClockSkew) -> None:
    """What the producer sets up in Redis before it is ready (`Startup` retries it)."""
    # Redis's clock measured before the first request: stamped until the `redis-clock` loop's
    # first measure, a restarted producer's first jobs were on its raw host clock
    await skew.sync(state.redis)
    streams = _partition_streams(state.keys, state.repository)
    await ensure_groups_where_streams_fit(state.redis, streams)
    # admission's scripts run when a submit failed, maybe on a server whose replicas do
    # not confirm writes: a NOSCRIPT then would hide behind the failed ack
    await preload(state.redis, [*job_scripts.ALL, *admission.SCRIPTS])
    await state.replies.start(_partition_tags(state.repository))
    # the live routes before the first request: config.yaml's split until then sent a
    # restarted producer's first requests where the live routes no longer do
    await state.traffic.refresh_routes()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Everything the producer starts, in order, and stops, in reverse order."""
    settings: Settings = app.state.settings
    configure_logging(settings.log_level)
    state = build_state(settings, app.state.repository)
    app.state.conveyor = state
    # the enqueue and `ttl_s` stamps on Redis's clock, which workers judge them by; a skew
    # the log tells, as a worker's heartbeat does
    skew = ClockSkew(EVERY_S, corrects=CLOCK)
    try:
        await state.startup.run(lambda: _redis_side_startup(state, skew))
    except CredentialsRefused as exc:  # a misconfiguration, no outage: no wait mends it
        refuse_start(exc)
    await state.tokens.start(_partition_tags(state.repository, "generate"))
    sweeper = BatchApiSweeper(state.batch_store, state.batch_progress)
    sweeper.start()
    state.traffic.start()
    state.eta_refresher.start()
    state.draining.start()
    # the startup has just measured: the loop's first measure is a period on (two TIMEs at once)
    clock = Periodic("redis-clock", EVERY_S, partial(skew.sync, state.redis), first_after_s=EVERY_S)
    clock.start()
    app.state.console = console = Console.build(state)
    console.start()
    settle_heap(settings)
    try:
        yield
    finally:
        await state.draining.stop()
        await state.startup.stop()
        await console.stop()
        await clock.stop()
        await state.eta_refresher.stop()
        await state.traffic.stop()
        await sweeper.stop()
        await state.tokens.stop()
        await state.replies.stop()
        await state.committing_redis.aclose()  # a cluster's held connections of its own
        await state.redis.aclose()


class HeadAsGet:
    """Answers a HEAD as the path's GET, without its body (RFC 9110 9.3.2), where no route takes
    HEAD itself: FastAPI's routes, unlike Starlette's, take only the methods they name, so a load
    balancer or uptime checker sending HEAD to a job, /v1/models or /metrics got 405. Once the
    headers are sent the response is complete, so the server tells the app the client left
    (ASGI) and a stream (events) ends instead of running on unread."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or _takes_head(scope):
            await self.app(scope, receive, send)
            return
        done = False

        async def headers_only(message: Message) -> None:
            nonlocal done
            if message["type"] == "http.response.start":
                await send(message)
            elif not done:  # the body's first part (or a pathsend): the response ends here
                done = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        as_get = {**scope, "method": "GET"}
        try:
            await self.app(as_get, receive, headers_only)
        finally:
            if "route" in as_get:  # the route that answered, for the metrics (http_metrics)
                scope["route"] = as_get["route"]


def _takes_head(scope: Scope) -> bool:
    """Whether a route of the app takes HEAD at the request's path itself (the probes)."""
    return any(route.matches(scope)[0] is Match.FULL for route in scope["app"].routes)


# Every resource's routes; a new resource adds its router here.
ROUTERS = (
    jobs_router,
    events_router,
    openai_router,
    batch_api_router,
    files_router,
    models_router,
    routes_router,
    canary_router,
    experiments_router,
    health_router,
    console_router,
    metrics_router,
)


def create_app(
    settings: Settings | None = None, repository: ModelRepository | None = None
) -> FastAPI:
    """The app; `repository`, where given, is the one its lifespan serves (loaded from
    `settings.model_repository` by the caller), else the lifespan loads it."""
    settings = settings or get_settings()

    app = FastAPI(
        title="Conveyor",
        version="0.1.0",
        summary="Queue-driven asynchronous inference",
        lifespan=lifespan,
        redirect_slashes=False,  # the error handlers' `_slash_twin` redirects, relative
    )
    app.state.settings = settings
    app.state.repository = repository
    install_error_handlers(app)
    app.add_middleware(
        RequestBoundaryMiddleware,
        limit=BodyLimit(settings.max_body_bytes, "CONVEYOR_MAX_BODY_BYTES"),
        upload_limit=BodyLimit(settings.max_upload_bytes, "CONVEYOR_MAX_UPLOAD_BYTES"),
        uploads=JSONL_UPLOADS | FILE_UPLOADS,
        max_depth=settings.max_json_depth,
        own_format=JSONL_UPLOADS,
        hosts=HostAllowList.of(settings),
    )
    app.add_middleware(HeadAsGet)  # outside the boundary: it authenticates the GET
    app.add_middleware(RateLimitHeadersMiddleware)
    app.add_middleware(ConsoleHeadersMiddleware)
    app.add_middleware(HttpMetricsMiddleware)
    if configure_tracing("conveyor-producer"):
        FastAPIInstrumentor.instrument_app(app, excluded_urls=UNTRACED)
    for router in ROUTERS:
        app.include_router(router)
    return app


def serving_app() -> FastAPI:
    """The app `uvicorn producer_api.app:app` serves. A bad CONVEYOR_* setting or config.yaml
    ends it in one line, before uvicorn starts the lifespan: Starlette hands uvicorn a
    lifespan's error as its whole traceback, which it logged before `Application startup
    failed`, the one line at its end. The repository loaded for that refusal is the one served:
    the lifespan read every config.yaml again, and served the second read."""
    settings = settings_or_exit()
    try:
        repository = ModelRepository.load(settings.model_repository, settings.result_ttl_s)
    except ModelConfigError as exc:
        raise SystemExit(f"Error: {exc}") from None
    return create_app(settings, repository)


app = serving_app()

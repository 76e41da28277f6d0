"""The producer ASGI app (`uvicorn producer_api.app:app`): wires routers, error handlers, the
body limit and the Redis-backed state built in the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from redis.exceptions import RedisError, ResponseError

from producer_api.batches.api_router import router as batches_router
from producer_api.body_limit import BodyLimitMiddleware
from producer_api.errors import install_error_handlers
from producer_api.events.api_router import router as events_router
from producer_api.health.api_router import router as health_router
from producer_api.http_metrics import HttpMetricsMiddleware
from producer_api.jobs.api_router import router as jobs_router
from producer_api.metrics.api_router import router as metrics_router
from producer_api.models.api_router import router as models_router
from producer_api.openai.api_router import router as openai_router
from producer_api.reply_listener import ReplyListener
from producer_api.state import ProducerState
from producer_api.token_hub import TokenHub
from shared.job_store import JobStore
from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.redis_client import connect
from shared.settings import Settings, get_settings
from shared.telemetry import configure_logging, configure_tracing

log = logging.getLogger(__name__)


async def _ensure_groups(client: aioredis.Redis, keys: Keys, repository: ModelRepository) -> None:
    """Create every partition's group up front so lag is measurable (KEDA) before any worker."""
    for config in repository:
        for variant in config.variants:
            for stream in (keys.queue(config.name, variant), keys.bulk_queue(config.name, variant)):
                try:
                    await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
                except ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_logging(settings.log_level)
        keys = Keys(settings.key_prefix)
        name = f"producer-{settings.instance_id}"
        client = connect(settings.redis_url, name=name)
        repository = ModelRepository.load(settings.model_repository)
        replies = ReplyListener(client, keys.reply(settings.instance_id))
        wake = keys.token_hub_wake(settings.instance_id)
        tokens = TokenHub(settings.redis_url, client, wake, f"{name}-tokens")
        try:
            await _ensure_groups(client, keys, repository)
            await replies.start()
        except RedisError as exc:
            log.warning("redis not reachable at startup (%s); readyz will say so", exc)
        await tokens.start()
        store = JobStore(client, keys, settings.result_ttl_s)
        app.state.conveyor = ProducerState(
            settings, keys, client, store, repository, replies, tokens
        )
        yield
        await tokens.stop()
        await replies.stop()
        await client.aclose()

    app = FastAPI(
        title="Conveyor",
        version="0.1.0",
        summary="Queue-driven asynchronous inference",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(HttpMetricsMiddleware)
    if configure_tracing("conveyor-producer"):
        FastAPIInstrumentor.instrument_app(app, excluded_urls="healthz,readyz,metrics")
    routers = (jobs_router, events_router, openai_router, batches_router, models_router)
    for router in (*routers, health_router, metrics_router):
        app.include_router(router)
    return app


app = create_app()

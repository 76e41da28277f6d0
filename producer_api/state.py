"""What every route needs, built once in the app's lifespan (`producer_api/app.py`) and reached
through `app.state`: the Redis-backed stores, limiters and dispatchers are long-lived objects
(each registers its Lua scripts once), never rebuilt per request."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from fastapi import Request

from producer_api.batch_api.progress import BatchApiProgress
from producer_api.draining import Draining
from producer_api.health.startup import Startup
from producer_api.jobs.admission import Backpressure, IdempotencyKeys
from producer_api.periodic import Periodic
from producer_api.reply_listener import ReplyListener
from producer_api.token_hub import TokenHub
from producer_api.traffic_control import TrafficControl
from shared.api_keys import ApiKeyStore
from shared.batch_api_store import BatchApiStore
from shared.file_store import FileStore
from shared.job_store import JobStore
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.queue_eta import QueueEta
from shared.rate_limit import InFlightLimiter, RateLimiter, StreamLimiter
from shared.redis_client import RedisClient
from shared.settings import Settings
from shared.webhook_events import WebhookDispatcher


@dataclass(slots=True, frozen=True)
class ProducerState:
    settings: Settings
    keys: Keys
    redis: aioredis.Redis
    # the submit path's group-committing client (its own connections on a cluster, closed with
    # the producer; over `redis`'s pool on one server)
    committing_redis: RedisClient
    repository: ModelRepository
    replies: ReplyListener
    tokens: TokenHub
    job_store: JobStore
    batch_store: BatchApiStore
    batch_progress: BatchApiProgress
    file_store: FileStore
    api_keys: ApiKeyStore
    rate_limiter: RateLimiter
    in_flight: InFlightLimiter
    open_streams: StreamLimiter
    idempotency: IdempotencyKeys
    backpressure: Backpressure
    queue_eta: QueueEta
    eta_refresher: Periodic  # refreshes `queue_eta` every REFRESH_S
    webhooks: WebhookDispatcher
    traffic: TrafficControl
    draining: Draining
    startup: Startup


async def producer_state(request: Request) -> ProducerState:
    """The dependency every route's services come from. Async on purpose: FastAPI runs plain
    `def` dependencies in its thread pool, a thread hand-off per request on the hot path."""
    state: ProducerState = request.app.state.conveyor
    return state

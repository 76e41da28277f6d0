"""What every route needs, built once in the app's lifespan and reached through `app.state`."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from fastapi import Request

from producer_api.reply_listener import ReplyListener
from producer_api.token_hub import TokenHub
from shared.job_store import JobStore
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.settings import Settings


@dataclass(slots=True)
class ProducerState:
    settings: Settings
    keys: Keys
    redis: aioredis.Redis
    store: JobStore
    repository: ModelRepository
    replies: ReplyListener
    tokens: TokenHub


def state_of(request: Request) -> ProducerState:
    state: ProducerState = request.app.state.conveyor
    return state


async def producer_state(request: Request) -> ProducerState:
    """The dependency form. Async on purpose: FastAPI runs plain `def` dependencies in its
    thread pool, a thread hand-off per request on the hot path."""
    return state_of(request)

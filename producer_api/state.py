"""What every route needs, built once in the app's lifespan and reached through `app.state`."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from fastapi import Request

from producer_api.reply_listener import ReplyListener
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


def producer_state(request: Request) -> ProducerState:
    state: ProducerState = request.app.state.conveyor
    return state

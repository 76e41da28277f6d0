"""A producer app served in this process: its lifespan run (Redis connections, scripts loaded,
background tasks), spoken to over ASGI with no socket, for tests that reach into its state or
need no worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import openai
from fastapi import FastAPI


@asynccontextmanager
async def app_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client


def openai_sdk(client: httpx.AsyncClient) -> openai.AsyncOpenAI:
    """OpenAI's SDK speaking to a producer served here (`app_client`), retrying nothing: what an
    OpenAI client sees of the producer's answers, with no socket and no worker."""
    return openai.AsyncOpenAI(
        base_url=client.base_url.join("/v1"), api_key="unused", http_client=client, max_retries=0
    )

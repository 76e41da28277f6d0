"""What users build without Conveyor, served for part A: a FastAPI endpoint that sends a Celery
task (Redis broker, Redis result backend, worker `--pool=solo`) and blocks on `.get()`, written
the usual way (a sync endpoint, so FastAPI runs it in its thread pool); and the same endpoint
answering in-process, the HTTP ceiling of any design on this server."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from celery import Celery
from celery.signals import worker_ready
from fastapi import FastAPI
from fastapi.responses import ORJSONResponse
from pydantic import BaseModel

from benchmarks.pipeline_stack import BIN, database_url, spawn, spawn_api, wait_until_answers
from conveyor.stack import Stack, free_port
from shared.heap_tuning import settle_heap
from shared.settings import Settings

# A database of its own: Conveyor's workers are Celery workers too, and on the same database
# they would take (and drop, as unregistered) the baseline's tasks from the default queue.
REDIS_URL = os.environ.get("BASELINE_REDIS_URL", "redis://127.0.0.1:6379/1")

celery_app = Celery("baseline", broker=REDIS_URL, backend=REDIS_URL)
celery_app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)


@celery_app.task(name="baseline.echo")
def echo(inputs: dict[str, Any]) -> dict[str, Any]:
    return inputs


class PredictBody(BaseModel):
    inputs: dict[str, Any]


@worker_ready.connect
def _settle_worker_heap(**_: Any) -> None:
    """The collector tuned as Conveyor's processes tune theirs (shared/heap_tuning.py): left at
    CPython's defaults, the baseline paid what Conveyor was spared, and its ratios flattered."""
    settle_heap(Settings())


@asynccontextmanager
async def _lifespan(_: FastAPI) -> AsyncIterator[None]:
    settle_heap(Settings())
    yield


app = FastAPI(title="celery baseline", lifespan=_lifespan)


@app.post("/celery/predict")
def celery_predict(body: PredictBody) -> ORJSONResponse:
    outputs = echo.delay(body.inputs).get(timeout=30)
    return ORJSONResponse({"outputs": outputs})


@app.post("/inprocess/predict")
async def inprocess_predict(body: PredictBody) -> ORJSONResponse:
    return ORJSONResponse({"outputs": body.inputs})


def start_baseline(stack: Stack, payload: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """Start the baseline's API (the same uvicorn command line as the producer's) and its Celery
    worker against the stack's Redis; returns the API's base URL and the two pids."""
    port = free_port()
    env = {"BASELINE_REDIS_URL": database_url(stack, 1)}
    api = spawn_api(stack, "baseline-api", "benchmarks.celery_baseline:app", port, env)
    worker = spawn(
        stack,
        "baseline-worker",
        [
            str(BIN / "celery"),
            "-A",
            "benchmarks.celery_baseline:celery_app",
            "worker",
            "--pool=solo",
            "--loglevel=WARNING",
            "--hostname=baseline@%h",
            "--without-mingle",
            "--without-gossip",
        ],
        env,
    )
    base_url = f"http://127.0.0.1:{port}"
    wait_until_answers(f"{base_url}/celery/predict", payload)
    return base_url, {"baseline api": api, "celery worker": worker}

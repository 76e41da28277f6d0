"""A job-events stream whose client left while its job was still queued, on a real Valkey with
the producer in-process (no worker: the job stays queued). sse-starlette stops the stream by
cancelling its task group's scope, and anyio cancels the task again on every loop turn until
it ends. Such a repeated cancel cut short the wait for the pending read of the events under
it, which were then closed while that read still ran them: "aclose(): asynchronous generator
is already running", an unhandled error logged with its traceback for every such client, and
the read under it was left to stop on its own (on a local stack, about one stream in six
left while its job was queued logged it). A stream left just as its job ended (its read of
the events done, with their end, as the cancel came) left that end unretrieved: asyncio logged
"Task exception was never retrieved" (StopAsyncIteration), about one a minute under load."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx
import pytest

from producer_api.app import create_app
from producer_api.auth.principal import ANONYMOUS, Principal
from producer_api.events.api_router import server_sent
from producer_api.events.serving import EventsService
from producer_api.state import ProducerState
from shared.rate_limit import Quota
from shared.settings import Settings
from tests.app_client import app_client

# a job that streams tokens (its events follow the token hub) and one that does not (they
# long-poll its end): both streams wait on a read of the events under them
BODIES = (
    {"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 4}},
    {"model": "minilm", "inputs": {"texts": ["hi"]}},
)
ROUNDS = 10  # each round's cancel lands at another point of the reads' clean-up
Body = AsyncGenerator[Any, None]
# a key with a streams cap, as a served key has: its stream takes a place and gives it back
KEYED = Principal(
    "default",
    frozenset({"submit", "read"}),
    frozenset(),
    "leaks-r36",
    Quota(1e3, 1_000, 1_000, 100),
)


@pytest.fixture
async def producer(redis_url: str) -> AsyncIterator[tuple[ProducerState, httpx.AsyncClient]]:
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="leaks-r36-left"))
    async with app_client(app) as client:
        yield app.state.conveyor, client


async def _opened(state: ProducerState, job_id: str, principal: Principal) -> Body:
    """The route's body iterator of the job's stream."""
    opened = await EventsService(state, principal).open(job_id, None)
    assert opened is not None
    return server_sent(opened, anyio.Event())


async def _left(body: Body, turns: int) -> BaseException | None:
    """Stop the stream as sse-starlette does when its client leaves: the scope around the next
    read is cancelled `turns` loop turns into it (anyio cancels again on each turn). What the
    read raised, CancelledError and the stream's end aside."""
    with anyio.CancelScope() as scope:
        reading = asyncio.ensure_future(anext(body))
        for _ in range(turns):
            await asyncio.sleep(0)
        scope.cancel()
        try:
            await reading
        except (asyncio.CancelledError, StopAsyncIteration):
            return None  # what a client's leaving raises, or the stream ended first
        except Exception as exc:  # what else it raised: the test's failure
            return exc
    return None


async def test_a_stream_left_while_queued_closes_its_reads_cleanly(
    producer: tuple[ProducerState, httpx.AsyncClient],
) -> None:
    state, client = producer
    job_ids = []
    for body in BODIES:
        await client.post("/v1/jobs", json=body)  # ahead of it: the job waits with a position
        job_ids.append((await client.post("/v1/jobs", json=body)).json()["id"])
    raised = []
    with _loop_failures() as failures:
        for job_id in job_ids:
            for turns in range(ROUNDS):
                body = await _opened(state, job_id, ANONYMOUS)
                assert (await anext(body)).event in {"queued", "scaling"}
                raised.append(await _left(body, turns))
    assert [repr(exc) for exc in raised if exc is not None] == []
    assert [context["message"] for context in failures] == []


async def test_a_stream_left_as_its_job_ends_leaves_no_end_unretrieved(
    producer: tuple[ProducerState, httpx.AsyncClient],
) -> None:
    state, client = producer
    raised = []
    with _loop_failures() as failures:
        for turns in range(3 * ROUNDS):
            job_id = (await client.post("/v1/jobs", json=BODIES[1])).json()["id"]
            body = await _opened(state, job_id, KEYED)
            await client.delete(f"/v1/jobs/{job_id}")  # it ends: its final is the next event
            assert (await anext(body)).event == "final"
            raised.append(await _left(body, turns))
    assert [repr(exc) for exc in raised if exc is not None] == []
    assert [context["message"] for context in failures] == []


@contextmanager
def _loop_failures() -> Iterator[list[dict[str, Any]]]:
    """What the event loop's exception handler is handed meanwhile (then after a collection:
    a read left running, or a task's unretrieved end, is reported when it is collected)."""
    loop = asyncio.get_running_loop()
    failures: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: failures.append(context))
    try:
        yield failures
        gc.collect()
    finally:
        loop.set_exception_handler(None)

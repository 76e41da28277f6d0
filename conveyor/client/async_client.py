"""`AsyncClient`: the asyncio SDK. The same operations (`calls.py`), retry policy and stream
resumption as `Client`, driven with `await`; only the I/O differs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import Any, TypeVar

import httpx
from typing_extensions import Unpack

from conveyor.client import calls
from conveyor.client.calls import BatchFileOptions, Call, JobOptions, Op, Pause, Progress
from conveyor.client.connection import http_options
from conveyor.client.errors import WIRE_ERRORS, APIError, connection_error
from conveyor.client.retries import OnRetry, RetryEvent, RetryPolicy
from conveyor.client.sse import RECONNECT_FOR_S, EventStream
from conveyor.client.types import (
    Batch,
    BatchList,
    BatchResults,
    ChatCompletion,
    ChatCompletionChunk,
    EmbeddingList,
    Event,
    FileDeleted,
    FileList,
    FileObject,
    Job,
)

T = TypeVar("T")


class AsyncClient:
    """`AsyncClient(base_url=None, api_key=None)`; methods as `Client`'s, awaitable. Use as an
    async context manager, or `await aclose()`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        on_retry: OnRetry | None = None,
    ) -> None:
        self.http = httpx.AsyncClient(**http_options(base_url, api_key, timeout))
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self.batches = AsyncBatches(self)
        self.files = AsyncFiles(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def submit(
        self,
        model: str,
        inputs: dict[str, Any],
        idempotency_key: str | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        return await self.run(calls.submit(model, inputs, idempotency_key, options))

    async def get(self, job_id: str, attempts: bool = False) -> Job:
        return await self.run(calls.get(job_id, attempts))

    async def wait(self, job_id: str, timeout: float | None = None, attempts: bool = False) -> Job:
        return await self.run(calls.wait(job_id, timeout, attempts))

    async def cancel(self, job_id: str) -> Job:
        return await self.run(calls.cancel(job_id))

    async def predict(
        self,
        model: str,
        inputs: dict[str, Any],
        timeout: float = 60.0,
        idempotency_key: str | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        """Cancelled (`asyncio.wait_for` timing out, a task cancelled), it cancels its job
        too, as a Ray Serve handle's cancelled response does; `submit` + `wait` to keep it."""
        key = idempotency_key or uuid.uuid4().hex
        try:
            return await self.run(calls.predict(model, inputs, timeout, key, options))
        except asyncio.CancelledError:
            await self._quietly(calls.abandon(model, inputs, key, options))
            raise

    async def _quietly(self, op: Op[object]) -> None:
        """Best effort, shielded from the cancellation that asked for it, and waited for no
        longer than ABANDON_S (a request that hangs would hold up `wait_for`'s timeout), then
        ended: it ran on in the background, its request held open for the client's timeout.
        What goes wrong (the producer gone, a second cancellation, which leaves it running on
        in the background) is not raised over that cancellation."""
        task = asyncio.ensure_future(self.run(op))
        task.add_done_callback(_retrieve)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task}, timeout=calls.ABANDON_S)
            task.cancel()  # nothing once it ended
            await asyncio.wait({task})

    async def chat(
        self, model: str, messages: list[dict[str, Any]], **params: Any
    ) -> ChatCompletion:
        return await self.run(calls.chat(model, messages, params))

    async def embed(self, model: str, texts: str | list[str], **params: Any) -> EmbeddingList:
        return await self.run(calls.embed(model, texts, params))

    async def chat_stream(
        self, model: str, messages: list[dict[str, Any]], **params: Any
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """Closed early (`aclose`), or ended by an error chunk, it closes its response then: left
        to asyncio's finalizer, the connection, whose close cancels the job, outlived it."""
        stream = EventStream(calls.chat_stream_call(model, messages, params), resumable=False)
        async with contextlib.aclosing(self.events(stream)) as events:
            async for event in events:
                if (chunk := calls.chat_chunk(event, stream.headers)) is not None:
                    yield chunk

    def stream(
        self,
        job_id: str,
        last_event_id: str | None = None,
        reconnect_for_s: float = RECONNECT_FOR_S,
    ) -> AsyncGenerator[Event, None]:
        call = calls.events_call(job_id, last_event_id)
        return self.events(EventStream(call, reconnect_for_s=reconnect_for_s))

    async def run(self, op: Op[T]) -> T:
        reply: httpx.Response | None = None
        while True:
            try:
                step = op.send(reply)
            except StopIteration as stop:
                result: T = stop.value
                return result
            if isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
                reply = None
            else:
                reply = await self.send(step)

    async def send(self, call: Call) -> httpx.Response:
        attempt = 0
        deadline = self.retry.deadline(call.deadline)
        while True:
            try:
                response = await self.http.send(call.build(self.http))
            except WIRE_ERRORS as exc:
                pause = self.retry.after_error(attempt, exc, call.repeatable, deadline)
                if pause is None:
                    raise connection_error(exc) from exc
            else:
                pause = self.retry.after_response(attempt, response, call.repeatable, deadline)
                if pause is None:
                    return call.checked(response, attempt)
            await self._pause(pause)
            attempt += 1

    async def _pause(self, pause: RetryEvent) -> None:
        if self.on_retry is not None:
            self.on_retry(pause)
        await asyncio.sleep(pause.delay_s)

    async def events(self, stream: EventStream) -> AsyncGenerator[Event, None]:
        while not stream.done:
            try:
                call = stream.next_call()
                response = await self.http.send(call.build(self.http), stream=True)
                try:
                    if response.is_error:
                        await response.aread()
                    stream.opened(call.checked(response, 0))
                    async for data in response.aiter_bytes():
                        for event in stream.feed_bytes(data):
                            yield event
                        if stream.done:
                            break
                finally:
                    await response.aclose()
                if not stream.done:
                    await asyncio.sleep(stream.closed())
            except WIRE_ERRORS as exc:
                await asyncio.sleep(stream.dropped(exc))
            except APIError as exc:
                await asyncio.sleep(stream.refused(exc))


def _retrieve(task: asyncio.Future[object]) -> None:
    """An abandoned task's error is read, so asyncio logs no "exception never retrieved"."""
    if not task.cancelled():
        task.exception()


class AsyncBatches:
    """`client.batches` of an AsyncClient."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(
        self,
        source: bytes | str | os.PathLike[str] | Iterable[Mapping[str, Any]],
        model: str | None = None,
        completion_window: str | None = None,
        webhook: str | None = None,
        idempotency_key: str | None = None,
        output_expires_after: int | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Batch:
        with calls.jsonl(source) as body:
            return await self.client.run(
                calls.create_batch(
                    body,
                    model,
                    completion_window,
                    webhook,
                    idempotency_key,
                    output_expires_after,
                    metadata,
                )
            )

    async def create_from_file(
        self,
        input_file_id: str,
        endpoint: str = "/v1/jobs",
        completion_window: str = "24h",
        **options: Unpack[BatchFileOptions],
    ) -> Batch:
        """OpenAI's create, from an upload (`client.files.create`); `options`: model (for lines
        that name none), webhook, metadata, output_expires_after (s), idempotency_key."""
        op = calls.create_batch_from_file(input_file_id, endpoint, completion_window, options)
        return await self.client.run(op)

    async def get(self, batch_id: str) -> Batch:
        return await self.client.run(calls.get_batch(batch_id))

    async def list(self, limit: int = 20, after: str | None = None) -> BatchList:
        return await self.client.run(calls.list_batches(limit, after))

    async def cancel(self, batch_id: str) -> Batch:
        return await self.client.run(calls.cancel_batch(batch_id))

    async def wait(
        self,
        batch_id: str,
        progress: Progress | None = None,
        poll_s: float = 1.0,
        timeout: float | None = None,
    ) -> Batch:
        return await self.client.run(calls.wait_batch(batch_id, poll_s, timeout, progress))

    async def results(self, batch_id: str) -> BatchResults:
        return await self.client.run(calls.batch_results(batch_id))


class AsyncFiles:
    """`client.files`: OpenAI's Files API for batches: uploads that batches are created from
    (`batches.create_from_file`), and an ended batch's output and errors files by their ids."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(
        self,
        source: bytes | str | os.PathLike[str] | Iterable[Mapping[str, Any]],
        expires_after: int | None = None,
    ) -> FileObject:
        """Upload `source` (JSONL bytes, a file path, or lines), purpose `batch`;
        `expires_after`: seconds it is kept (3600 to 2592000), the result TTL at most."""
        with calls.jsonl(source) as body:
            op = calls.upload_file(body, calls.filename_of(source), expires_after)
            return await self.client.run(op)

    async def get(self, file_id: str) -> FileObject:
        return await self.client.run(calls.get_file(file_id))

    async def list(
        self, limit: int = 100, after: str | None = None, order: str = "desc"
    ) -> FileList:
        """The tenant's uploads, newest first (`order="asc"`: oldest): `after=page.last_id`
        while `page.has_more`."""
        return await self.client.run(calls.list_files(limit, after, order))

    async def delete(self, file_id: str) -> FileDeleted:
        return await self.client.run(calls.delete_file(file_id))

    async def content(self, file_id: str) -> bytes:
        return await self.client.run(calls.file_content(file_id))

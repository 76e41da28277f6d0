"""`Client`: the blocking SDK. It runs the operations of `calls.py`, retrying 429/503 and
lost connections by `RetryPolicy`, and resumes event streams by `sse.EventStream`."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
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


class Client:
    """`Client(base_url=None, api_key=None)`: defaults from `CONVEYOR_URL` and
    `CONVEYOR_API_KEY`. Use as a context manager, or call `close()`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        on_retry: OnRetry | None = None,
    ) -> None:
        self.http = httpx.Client(**http_options(base_url, api_key, timeout))
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self.batches = Batches(self)
        self.files = Files(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def submit(
        self,
        model: str,
        inputs: dict[str, Any],
        idempotency_key: str | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        """Enqueue a job (202); `options`: variant, parameters, routing_key, deadline, ttl_s,
        priority ("online" | "bulk"), webhook."""
        return self.run(calls.submit(model, inputs, idempotency_key, options))

    def get(self, job_id: str, attempts: bool = False) -> Job:
        """The job; `attempts`: with its `attempt_history` (worker, times, outcome, error)."""
        return self.run(calls.get(job_id, attempts))

    def wait(self, job_id: str, timeout: float | None = None, attempts: bool = False) -> Job:
        """The job once it ends (WaitTimeout after `timeout` seconds)."""
        return self.run(calls.wait(job_id, timeout, attempts))

    def cancel(self, job_id: str) -> Job:
        return self.run(calls.cancel(job_id))

    def predict(
        self,
        model: str,
        inputs: dict[str, Any],
        timeout: float = 60.0,
        idempotency_key: str | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        """Submit and wait for a succeeded job (APIError if it failed, was cancelled or expired).
        Interrupted (Ctrl-C), it cancels its job too, best effort; `submit` + `wait` to keep it."""
        key = idempotency_key or uuid.uuid4().hex
        try:
            return self.run(calls.predict(model, inputs, timeout, key, options))
        except KeyboardInterrupt:
            with contextlib.suppress(Exception, KeyboardInterrupt):  # a second Ctrl-C: stop
                self.run(calls.abandon(model, inputs, key, options))
            raise

    def chat(self, model: str, messages: list[dict[str, Any]], **params: Any) -> ChatCompletion:
        """OpenAI-style chat completion (`POST /v1/chat/completions`)."""
        return self.run(calls.chat(model, messages, params))

    def embed(self, model: str, texts: str | list[str], **params: Any) -> EmbeddingList:
        """OpenAI-style embeddings (`POST /v1/embeddings`) of a model of `task: embed`; each
        vector as numbers unless `encoding_format` is given."""
        return self.run(calls.embed(model, texts, params))

    def chat_stream(
        self, model: str, messages: list[dict[str, Any]], **params: Any
    ) -> Iterator[ChatCompletionChunk]:
        """The same, streamed (`stream: true`): chunks until `data: [DONE]`."""
        stream = EventStream(calls.chat_stream_call(model, messages, params), resumable=False)
        for event in self.events(stream):
            if (chunk := calls.chat_chunk(event, stream.headers)) is not None:
                yield chunk

    def stream(
        self,
        job_id: str,
        last_event_id: str | None = None,
        reconnect_for_s: float = RECONNECT_FOR_S,
    ) -> Iterator[Event]:
        """The job's events (`GET /v1/jobs/{id}/events`), each exactly once, resuming after a
        dropped connection from the last event received; StreamError once resumes failed for
        `reconnect_for_s` seconds without an event (an outage outlasting it)."""
        call = calls.events_call(job_id, last_event_id)
        return self.events(EventStream(call, reconnect_for_s=reconnect_for_s))

    def run(self, op: Op[T]) -> T:
        """Drive an operation of `calls.py` to its result."""
        reply: httpx.Response | None = None
        while True:
            try:
                step = op.send(reply)
            except StopIteration as stop:
                result: T = stop.value
                return result
            if isinstance(step, Pause):
                time.sleep(step.seconds)
                reply = None
            else:
                reply = self.send(step)

    def send(self, call: Call) -> httpx.Response:
        """One call, retried by the policy; raises APIError for an error status (`Call.checked`)."""
        attempt = 0
        deadline = self.retry.deadline(call.deadline)
        while True:
            try:
                response = self.http.send(call.build(self.http))
            except WIRE_ERRORS as exc:
                pause = self.retry.after_error(attempt, exc, call.repeatable, deadline)
                if pause is None:
                    raise connection_error(exc) from exc
            else:
                pause = self.retry.after_response(attempt, response, call.repeatable, deadline)
                if pause is None:
                    return call.checked(response, attempt)
            self._pause(pause)
            attempt += 1

    def _pause(self, pause: RetryEvent) -> None:
        if self.on_retry is not None:
            self.on_retry(pause)
        time.sleep(pause.delay_s)

    def events(self, stream: EventStream) -> Iterator[Event]:
        while not stream.done:
            try:
                call = stream.next_call()
                response = self.http.send(call.build(self.http), stream=True)
                try:
                    if response.is_error:
                        response.read()
                    stream.opened(call.checked(response, 0))
                    for data in response.iter_bytes():
                        yield from stream.feed_bytes(data)
                        if stream.done:
                            break
                finally:
                    response.close()
                if not stream.done:
                    time.sleep(stream.closed())
            except WIRE_ERRORS as exc:
                time.sleep(stream.dropped(exc))
            except APIError as exc:
                time.sleep(stream.refused(exc))


class Batches:
    """`client.batches`: JSONL batches on the bulk lane."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def create(
        self,
        source: bytes | str | os.PathLike[str] | Iterable[Mapping[str, Any]],
        model: str | None = None,
        completion_window: str | None = None,
        webhook: str | None = None,
        idempotency_key: str | None = None,
        output_expires_after: int | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Batch:
        """`source`: JSONL bytes, a file path, or lines `{"custom_id", "body": {...}}`.
        `output_expires_after`: seconds its output and error files are kept from its end
        (OpenAI's policy, 3600 to 2592000), the server's result TTL at most; None: that TTL.
        `metadata`: OpenAI's key-value pairs (16 at most), kept and shown with the batch."""
        with calls.jsonl(source) as body:
            return self.client.run(
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

    def create_from_file(
        self,
        input_file_id: str,
        endpoint: str = "/v1/jobs",
        completion_window: str = "24h",
        **options: Unpack[BatchFileOptions],
    ) -> Batch:
        """OpenAI's create, from an upload (`client.files.create`); `options`: model (for lines
        that name none), webhook, metadata, output_expires_after (s), idempotency_key."""
        op = calls.create_batch_from_file(input_file_id, endpoint, completion_window, options)
        return self.client.run(op)

    def get(self, batch_id: str) -> Batch:
        return self.client.run(calls.get_batch(batch_id))

    def list(self, limit: int = 20, after: str | None = None) -> BatchList:
        """The tenant's batches, newest first: `after=page.last_id` while `page.has_more`."""
        return self.client.run(calls.list_batches(limit, after))

    def cancel(self, batch_id: str) -> Batch:
        return self.client.run(calls.cancel_batch(batch_id))

    def wait(
        self,
        batch_id: str,
        progress: Progress | None = None,
        poll_s: float = 1.0,
        timeout: float | None = None,
    ) -> Batch:
        """Poll until the batch ends; `progress(batch)` is called after every look."""
        return self.client.run(calls.wait_batch(batch_id, poll_s, timeout, progress))

    def results(self, batch_id: str) -> BatchResults:
        """Outputs and errors of an ended batch, in line order."""
        return self.client.run(calls.batch_results(batch_id))


class Files:
    """`client.files`: OpenAI's Files API for batches: uploads that batches are created from
    (`batches.create_from_file`), and an ended batch's output and errors files by their ids."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def create(
        self,
        source: bytes | str | os.PathLike[str] | Iterable[Mapping[str, Any]],
        expires_after: int | None = None,
    ) -> FileObject:
        """Upload `source` (JSONL bytes, a file path, or lines), purpose `batch`;
        `expires_after`: seconds it is kept (3600 to 2592000), the result TTL at most."""
        with calls.jsonl(source) as body:
            op = calls.upload_file(body, calls.filename_of(source), expires_after)
            return self.client.run(op)

    def get(self, file_id: str) -> FileObject:
        return self.client.run(calls.get_file(file_id))

    def list(self, limit: int = 100, after: str | None = None, order: str = "desc") -> FileList:
        """The tenant's uploads, newest first (`order="asc"`: oldest): `after=page.last_id`
        while `page.has_more`."""
        return self.client.run(calls.list_files(limit, after, order))

    def delete(self, file_id: str) -> FileDeleted:
        return self.client.run(calls.delete_file(file_id))

    def content(self, file_id: str) -> bytes:
        return self.client.run(calls.file_content(file_id))

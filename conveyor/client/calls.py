"""Every SDK operation, written once as a generator that yields what to do (`Call` an endpoint,
`Pause`) and receives the responses; `Client` and `AsyncClient` only run them, so waiting,
polling and parsing have one implementation for both."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import IO, Any, TypedDict, TypeVar
from urllib.parse import quote

import httpx
import orjson
from pydantic import BaseModel

from conveyor.client.errors import (
    InvalidArgument,
    NotFound,
    StreamFailed,
    WaitTimeout,
    api_error,
    raise_for_error,
)
from conveyor.client.types import (
    Batch,
    BatchError,
    BatchList,
    BatchOutput,
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
from shared.codec import float32_values

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Ended = TypeVar("Ended", Job, Batch)  # what a cancel answers
LONG_POLL_S = 30.0  # one long-poll request; the server caps it at CONVEYOR_MAX_WAIT_S anyway
SLACK_S = 15.0  # HTTP timeout beyond the time the server was asked to wait
STREAM_TIMEOUT_S = 60.0  # an event stream's: four of the server's keep-alive pings
ABANDON_S = 10.0  # an abandoned predict's cancel is retried for no longer
CHUNK_BYTES = 64 * 1024  # a file body is read and sent this much at a time, as httpx reads one
Body = bytes | IO[bytes]  # a request body: its bytes, or a file sent as it is read
Source = bytes | str | os.PathLike[str] | Iterable[Mapping[str, Any]]  # a batch's lines


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP request; `repeatable` says sending it twice does no harm (for retries)."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    content: Body | None = None
    form: Mapping[str, str] | None = None  # a multipart form's fields, beside `files`
    files: Mapping[str, tuple[str, Body]] | None = None  # name: (filename, content)
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    repeatable: bool = True
    deadline: float | None = None  # monotonic: no retry after it (a wait's timeout)
    # This status to a resend (a cancel's 409, a delete's 404) reaches the op, not raised: the
    # try whose answer was lost may have done it.
    resent_to_op: int | None = None
    # The query parameter (in `params`) that asks the server to wait that many seconds: see
    # `bounded`.
    wait_param: str | None = None
    # What the path names (`job a/b`), for a 404 whose answer names nothing: see `checked`.
    subject: str | None = None

    def build(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The request of this try: built again for each, so a retry asks for the time left."""
        params, timeout_s = self.bounded()
        timeout = client.timeout if timeout_s is None else _reading_for(client.timeout, timeout_s)
        length, content = _streamed(self.content, isinstance(client, httpx.AsyncClient))
        try:
            return client.build_request(
                self.method,
                self.path,
                params=params,
                json=self.json,
                content=content,
                data=self.form,
                files=self.files,
                headers={**self.headers, **length},
                timeout=timeout,
            )
        except httpx.InvalidURL as exc:  # an id or a query past httpx's 65536 characters
            raise InvalidArgument(f"the request's URL cannot be sent: {exc}") from None
        except (ValueError, RecursionError) as exc:
            unsendable = _unsendable(exc, self.json is not None)
            if unsendable is None:
                raise
            raise unsendable from None

    def bounded(self) -> tuple[Mapping[str, Any] | None, float | None]:
        """`params` and the HTTP timeout of a try: a call that asks the server to wait
        (`wait_param`) asks at most for the time left before `deadline` (0 at the least), and
        waits for the answer that long plus SLACK_S. A retry resent the first
        try's: `predict(timeout=61)` refused 60 s (a 429) asked for 60 s more."""
        if self.wait_param is None or self.params is None:
            return self.params, self.timeout
        asked = float(self.params[self.wait_param])
        if self.deadline is not None:
            asked = min(asked, self.deadline - time.monotonic())
        asked = max(0.0, asked)
        return {**self.params, self.wait_param: asked}, asked + SLACK_S

    def checked(self, response: httpx.Response, attempt: int) -> httpx.Response:
        """The response the op receives for try number `attempt` (0: the first), or its
        APIError. A 404 whose message is only its status's phrase (an id holding `/`, sent as
        one segment, is decoded by the producer's router before routing and reaches no route;
        a proxy's bare 404) names `subject`: its "Not Found" named neither the job nor its id."""
        if attempt and response.status_code == self.resent_to_op:
            return response
        try:
            return raise_for_error(response)
        except NotFound as error:
            if self.subject is None or error.message != response.reason_phrase:
                raise
            raise NotFound(404, error.type, f"{self.subject} not found", error.headers) from error


def _unsendable(exc: ValueError | RecursionError, has_json: bool) -> InvalidArgument | None:
    """Why httpx could not encode a request (None: not known to be its header or JSON): a
    header value past ASCII (an Idempotency-Key `clé`, read as the JSON's "lone surrogate"
    before), or its JSON (a lone surrogate such as `"\\ud800"`, a NaN, nesting past Python's
    recursion limit), as the argument error it is: it escaped as httpx's own traceback, a CLI's
    too. A character is named escaped: printed raw, a surrogate failed."""
    if isinstance(exc, UnicodeEncodeError) and exc.encoding == "ascii":  # httpx's headers
        held = exc.object[exc.start : exc.end]
        return InvalidArgument(f"a header cannot be sent: it holds {held!r}, not ASCII")
    if not has_json:
        return None
    if isinstance(exc, UnicodeEncodeError):
        why = f"a string holds {exc.object[exc.start : exc.end]!r}, a lone surrogate"
    elif isinstance(exc, RecursionError):
        why = "it is nested too deeply"
    else:
        why = str(exc)
    return InvalidArgument(f"the request's JSON body cannot be sent: {why}")


def _streamed(
    content: Body | None, for_async: bool
) -> tuple[dict[str, str], bytes | Iterator[bytes] | AsyncIterator[bytes] | None]:
    """A file body as chunks read while they are sent, from its start: a retry resends all of
    it. Its Content-Length goes with it, as the bytes' did, so a server refuses one over its
    limit before reading it, not after a chunked body of 100 MiB."""
    if content is None or isinstance(content, bytes):
        return {}, content
    size = content.seek(0, os.SEEK_END)
    content.seek(0)
    chunks = iter(partial(content.read, CHUNK_BYTES), b"")
    return {"Content-Length": str(size)}, _async(chunks) if for_async else chunks


async def _async(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks` for an AsyncClient, which sends no sync stream (a local file's reads block no
    longer than httpx's own multipart upload's do)."""
    for chunk in chunks:
        yield chunk


def _reading_for(own: httpx.Timeout, seconds: float) -> httpx.Timeout:
    """The client's timeout, reads and writes allowed `seconds` at least: a call's own timeout
    (a long-poll, a completion) is how long its answer may take, not how long to wait for a
    connection, which took a chat six tries of 600 s each to a producer that did not answer."""

    def wider(limit: float | None) -> float | None:
        return None if limit is None else max(limit, seconds)

    return httpx.Timeout(
        connect=own.connect, read=wider(own.read), write=wider(own.write), pool=own.pool
    )


def parsed(model: type[M], response: httpx.Response) -> M:
    """The answer as `model`. One the producer cannot have sent (a proxy's login page, another
    service at its URL, answering 200) is an APIError with its status and `invalid_response`,
    as an error answer that is not the producer's is: it was a JSONDecodeError or pydantic's
    ValidationError, which no `except APIError` caught."""
    return _parsed(model, response.content, response)


def parsed_lines(model: type[M], response: httpx.Response) -> list[M]:
    """A JSONL answer's lines, each as `model` (`parsed`'s error for one that is not)."""
    return [_parsed(model, line, response) for line in response.content.splitlines()]


def _parsed(model: type[M], content: bytes, response: httpx.Response) -> M:
    try:
        return model.model_validate_json(content)
    except ValueError as exc:  # pydantic's ValidationError is one
        message = f"not the producer's answer: {response.text[:200]!r}"
        raise api_error(
            response.status_code, "invalid_response", message, response.headers
        ) from exc


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


Op = Generator[Call | Pause, Any, T]
Progress = Callable[[Batch], None]


class JobOptions(TypedDict, total=False):
    variant: str
    parameters: dict[str, Any]
    routing_key: str
    deadline: float
    ttl_s: float
    priority: str
    webhook: str


def _deadline(timeout: float | None) -> float | None:
    """NaN would wait forever, unnoticed (no clock reading is ever past it)."""
    if timeout is not None and not timeout >= 0:
        raise InvalidArgument(f"timeout {timeout!r}: seconds, 0 or more (None: no limit)")
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None, most: float) -> float:
    return most if deadline is None else max(0.0, min(most, deadline - time.monotonic()))


def segment(value: str) -> str:
    """`value` as one URL path segment: an id holding `/`, `?`, `#` or a dot segment names a
    resource of its own and never reaches another route (`get("../models")` read the model
    list, `cancel` of such an id could DELETE elsewhere)."""
    if not value:
        raise InvalidArgument("an id or name cannot be empty")
    quoted = quote(value, safe="")
    return quoted.replace(".", "%2E") if value in (".", "..") else quoted


# The collection of each kind of resource the SDK names by id.
COLLECTIONS = {"job": "jobs", "file": "files", "batch": "batches"}


class At(TypedDict):
    path: str
    subject: str


def at(kind: str, resource_id: str, rest: str = "") -> At:
    """A call's `path` to one resource (its id one `segment`, then `rest`) and the `subject` a
    bare 404 of it names (`job a/b`)."""
    path = f"/v1/{COLLECTIONS[kind]}/{segment(resource_id)}{rest}"
    return At(path=path, subject=f"{kind} {resource_id}")


def events_call(job_id: str, last_event_id: str | None) -> Call:
    """`GET /v1/jobs/{id}/events`, resumed after `last_event_id` when given. Its timeout is the
    stream's own, well past the server's 15 s pings: the client's (`Client(timeout=10)`) cut a
    quiet job's stream again and again, and StreamError ended it while the job ran on."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    return Call("GET", **at("job", job_id, "/events"), headers=headers, timeout=STREAM_TIMEOUT_S)


def submit(
    model: str, inputs: dict[str, Any], idempotency_key: str | None, options: JobOptions
) -> Op[Job]:
    response = yield submit_call(model, inputs, idempotency_key, options)
    return parsed(Job, response)


def submit_call(
    model: str, inputs: dict[str, Any], idempotency_key: str | None, options: JobOptions
) -> Call:
    """`POST /v1/jobs`. An Idempotency-Key is always sent (a fresh one by default), so retrying
    a submit whose answer was lost never enqueues the job twice."""
    headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
    body = {"model": model, "inputs": inputs, **options}
    return Call("POST", "/v1/jobs", json=body, headers=headers)


def get(job_id: str, attempts: bool = False) -> Op[Job]:
    """`attempts`: with the job's `attempt_history`."""
    response = yield Call("GET", **at("job", job_id), params=_attempts(attempts))
    return parsed(Job, response)


def wait(job_id: str, timeout: float | None, attempts: bool = False) -> Op[Job]:
    """Long-polls (the server answers as soon as the job ends), so no request is wasted."""
    deadline = _deadline(timeout)
    while True:
        params = {"wait": _left(deadline, LONG_POLL_S), **_attempts(attempts)}
        response = yield Call(
            "GET", **at("job", job_id), params=params, deadline=deadline, wait_param="wait"
        )
        job = parsed(Job, response)
        if job.done:
            return job
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"job {job_id} still {job.status} after {timeout}s", job)


def _attempts(attempts: bool) -> dict[str, str]:
    return {"attempts": "true"} if attempts else {}


def cancel(job_id: str, deadline: float | None = None) -> Op[Job]:
    """`deadline`: no retry after it."""
    call = Call("DELETE", **at("job", job_id), deadline=deadline)
    return (yield from _cancel(call, Job, get, job_id))


def _cancel(
    call: Call, model: type[Ended], read: Callable[[str], Op[Ended]], id_: str
) -> Op[Ended]:
    """A resent cancel's 409 may answer this call's own first try, which cancelled the job (or
    batch) but whose answer was lost (a 503, a dropped connection): it is read, and returned
    if it is cancelled, rather than a Conflict."""
    response = yield replace(call, resent_to_op=409)
    if response.status_code != 409:
        return parsed(model, response)
    found = yield from read(id_)
    if found.status != "cancelled":
        raise_for_error(response)
    return found


_FAILED_AS = {"failed": 422, "cancelled": 409, "expired": 504}


def predict(
    model: str, inputs: dict[str, Any], timeout: float, key: str, options: JobOptions
) -> Op[Job]:
    """Submit and wait: the finished job, or the APIError a job that failed (422), was
    cancelled (409) or expired (504) is answered with at `/predict`; WaitTimeout (with the job)
    once `timeout` runs out, as `wait`'s; `timeout=0` too, unless the job ended at once. Sent
    as a submit that waits (`POST /v1/jobs?wait=`) with its Idempotency-Key, so a 503 or a
    connection lost mid-request is sent again safely: the resend answers with the job the first
    try made. `key`: its Idempotency-Key, which `abandon` finds the job by."""
    deadline = _deadline(timeout)
    response = yield replace(
        submit_call(model, inputs, key, options),
        params={"wait": _left(deadline, LONG_POLL_S * 2)},
        deadline=deadline,
        wait_param="wait",
    )
    job = parsed(Job, response)
    if response.status_code == 202:
        job = yield from wait(job.id, _left(deadline, float("inf")))
    if not job.succeeded:
        error = job.error
        message = f"job {job.id} {job.status}: {error.message if error else ''}"
        raise api_error(
            _FAILED_AS.get(job.status, 500), error.type if error else job.status, message
        )
    return job


def abandon(model: str, inputs: dict[str, Any], key: str, options: JobOptions) -> Op[None]:
    """A predict's caller gave up (its task cancelled, Ctrl-C): its job, found by the predict's
    Idempotency-Key (resent, the submit answers with the job the first try made, or makes it
    if none arrived), is cancelled unless it ended. It ran on, using a worker for nobody.
    Retries end within ABANDON_S: the caller is waiting for its cancellation to finish."""
    deadline = time.monotonic() + ABANDON_S
    response = yield replace(submit_call(model, inputs, key, options), deadline=deadline)
    job = parsed(Job, response)
    if not job.done:
        yield from cancel(job.id, deadline)


def chat(model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> Op[ChatCompletion]:
    body = {"model": model, "messages": messages, **params, "stream": False}
    response = yield Call("POST", "/v1/chat/completions", json=body, timeout=600, repeatable=False)
    return parsed(ChatCompletion, response)


def embed(model: str, texts: str | list[str], params: dict[str, Any]) -> Op[EmbeddingList]:
    """`POST /v1/embeddings`. Unless `encoding_format` is given, the vectors travel as base64
    (under half the bytes, nothing for the server to parse) and come back decoded, as OpenAI's
    client does. Not sent again after a 503, as `chat`: it carries no Idempotency-Key, and a
    draining producer answers 503 to a request whose job it already queued (the job runs on),
    so a resend ran the job twice."""
    body = {"model": model, "input": texts, "encoding_format": "base64", **params}
    response = yield Call("POST", "/v1/embeddings", json=body, timeout=600, repeatable=False)
    answer = parsed(EmbeddingList, response)
    if "encoding_format" not in params:
        for item in answer.data:
            if isinstance(item.embedding, str):
                item.embedding = float32_values(item.embedding)
    return answer


class BatchFileOptions(TypedDict, total=False):
    """A create from an uploaded file's options beside the file, endpoint and window."""

    model: str | None  # Conveyor's: for lines that name none
    webhook: str | None
    metadata: Mapping[str, str] | None
    output_expires_after: int | None  # s; OpenAI's policy, its one anchor the files' creation
    idempotency_key: str | None


def filename_of(source: Source) -> str:
    """The name an upload of `source` gets: a path's own, else `batch.jsonl`."""
    return Path(source).name if isinstance(source, str | os.PathLike) else "batch.jsonl"


@contextmanager
def jsonl(source: Source) -> Iterator[Body]:
    """A batch's JSONL from bytes, a file path, or an iterable of lines
    (`{"custom_id", "body": {...}}` mappings), for the sends in this block. A path is opened,
    not read: its bytes go out as they are read, where a file of CONVEYOR_MAX_UPLOAD_BYTES
    (100 MiB) was held in memory whole first."""
    if isinstance(source, str | os.PathLike):
        with Path(source).open("rb") as file:
            file.peek(1)  # one that fails to read fails here, not once a connection is made
            yield file
    elif isinstance(source, bytes):
        yield source
    else:
        yield b"".join(orjson.dumps(line) + b"\n" for line in source)


def create_batch(
    source: Body,
    model: str | None,
    completion_window: str | None,
    webhook: str | None,
    idempotency_key: str | None,
    output_expires_after: int | None,
    metadata: Mapping[str, str] | None = None,
) -> Op[Batch]:
    """An Idempotency-Key is always sent (a fresh one by default), as a submit's is: a create
    retried after its answer was lost answers with the batch it made, not a second one that
    runs every line again. `output_expires_after` (s) goes as OpenAI's policy, its one anchor
    the files' creation, and `metadata` as `metadata[KEY]` pairs, in the query parameters the
    JSONL body's options travel in."""
    options: dict[str, str | int | None] = {
        "model": model,
        "completion_window": completion_window,
        "webhook": webhook,
    }
    if output_expires_after is not None:
        options["output_expires_after[anchor]"] = "created_at"
        options["output_expires_after[seconds]"] = output_expires_after
    options.update({f"metadata[{key}]": value for key, value in (metadata or {}).items()})
    key = idempotency_key or uuid.uuid4().hex
    response = yield Call(
        "POST",
        "/v1/batches",
        params={k: v for k, v in options.items() if v is not None},
        content=source,
        headers={"Content-Type": "application/jsonl", "Idempotency-Key": key},
        timeout=300,
    )
    return parsed(Batch, response)


def create_batch_from_file(
    input_file_id: str, endpoint: str, completion_window: str, options: BatchFileOptions
) -> Op[Batch]:
    """OpenAI's create, naming an upload (`upload_file`): one file may feed many batches. An
    Idempotency-Key is always sent, as `create_batch` sends one."""
    seconds = options.get("output_expires_after")
    body = {
        "input_file_id": input_file_id,
        "endpoint": endpoint,
        "completion_window": completion_window,
        "model": options.get("model"),
        "webhook": options.get("webhook"),
        "metadata": options.get("metadata"),
        "output_expires_after": None
        if seconds is None
        else {"anchor": "created_at", "seconds": seconds},
    }
    sent = {name: value for name, value in body.items() if value is not None}
    key = options.get("idempotency_key") or uuid.uuid4().hex
    response = yield Call("POST", "/v1/batches", json=sent, headers={"Idempotency-Key": key})
    return parsed(Batch, response)


def upload_file(source: Body, filename: str, expires_after: int | None) -> Op[FileObject]:
    """Not resent once it may have reached the server (`repeatable` off): the upload takes no
    Idempotency-Key, and a resend after a lost answer would store a second file."""
    form = {"purpose": "batch"}
    if expires_after is not None:
        form |= {
            "expires_after[anchor]": "created_at",
            "expires_after[seconds]": str(expires_after),
        }
    response = yield Call(
        "POST",
        "/v1/files",
        form=form,
        files={"file": (filename, source)},
        timeout=300,
        repeatable=False,
    )
    return parsed(FileObject, response)


def get_file(file_id: str) -> Op[FileObject]:
    return parsed(FileObject, (yield Call("GET", **at("file", file_id))))


def list_files(limit: int, after: str | None, order: str) -> Op[FileList]:
    params: dict[str, str | int] = {"limit": limit, "order": order}
    if after:
        params["after"] = after
    return parsed(FileList, (yield Call("GET", "/v1/files", params=params)))


def delete_file(file_id: str) -> Op[FileDeleted]:
    """A resend's 404 answers a first try that deleted the file but whose answer was lost (a
    dropped connection): the file is gone, as asked, rather than NotFound."""
    response = yield Call("DELETE", **at("file", file_id), resent_to_op=404)
    if response.status_code == 404:
        return FileDeleted(id=file_id, deleted=True)
    return parsed(FileDeleted, response)


def file_content(file_id: str) -> Op[bytes]:
    """An upload's bytes, or an ended batch's output or errors file (JSONL)."""
    response = yield Call("GET", **at("file", file_id, "/content"), timeout=600)
    return response.content


def get_batch(batch_id: str, deadline: float | None = None) -> Op[Batch]:
    """`deadline`: a wait's (no retry after it)."""
    response = yield Call("GET", **at("batch", batch_id), deadline=deadline)
    return parsed(Batch, response)


def list_batches(limit: int, after: str | None) -> Op[BatchList]:
    params: dict[str, str | int] = {"limit": limit, **({"after": after} if after else {})}
    response = yield Call("GET", "/v1/batches", params=params)
    return parsed(BatchList, response)


def cancel_batch(batch_id: str) -> Op[Batch]:
    """Resent after a lost answer, as a job's `cancel` is: the resend finds the batch no longer
    running (409) when the first try cancelled it."""
    call = Call("POST", **at("batch", batch_id, "/cancel"))
    return (yield from _cancel(call, Batch, get_batch, batch_id))


def wait_batch(
    batch_id: str, poll_s: float, timeout: float | None, progress: Progress | None
) -> Op[Batch]:
    """Poll until the batch ends, calling `progress` with each look."""
    if not poll_s > 0:  # NaN or a negative one was time.sleep's ValueError, 0 a busy loop
        raise InvalidArgument(f"poll_s {poll_s!r}: seconds between looks, more than 0")
    deadline = _deadline(timeout)
    while True:
        batch = yield from get_batch(batch_id, deadline)
        if progress is not None:
            progress(batch)
        if batch.done:
            return batch
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"batch {batch_id} still {batch.status} after {timeout}s", batch)
        yield Pause(_left(deadline, poll_s))


def batch_results(batch_id: str) -> Op[BatchResults]:
    outputs = yield Call("GET", **at("batch", batch_id, "/output"), timeout=600)
    errors = yield Call("GET", **at("batch", batch_id, "/errors"), timeout=600)
    return BatchResults(
        outputs=parsed_lines(BatchOutput, outputs), errors=parsed_lines(BatchError, errors)
    )


def chat_stream_call(model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> Call:
    body = {"model": model, "messages": messages, **params, "stream": True}
    return Call("POST", "/v1/chat/completions", json=body, timeout=600, repeatable=False)


def chat_chunk(event: Event, headers: httpx.Headers | None = None) -> ChatCompletionChunk | None:
    """A chunk of a streamed chat completion; None for the closing `[DONE]`. An error chunk
    (`{"error": {type, message}}`, how the server ends a stream it cannot finish) raises
    StreamFailed: read as a chunk, it raised pydantic's ValidationError. Data that is no chunk
    (a proxy's page) is `invalid_response`, as `parsed` makes a whole answer that is not the
    producer's: it was orjson's or pydantic's error, which no `except APIError` caught.
    `headers`: the stream's response's, so the error's `request_id` names the completion's job
    (it was None)."""
    if event.data == "[DONE]":
        return None
    try:
        body = orjson.loads(event.data)
        if isinstance(body, dict) and isinstance(error := body.get("error"), dict):
            raise StreamFailed(200, str(error.get("type")), str(error.get("message")), headers)
        return ChatCompletionChunk.model_validate(body)
    except ValueError as exc:  # orjson's JSONDecodeError, pydantic's ValidationError
        message = f"not the producer's chunk: {event.data[:200]!r}"
        raise api_error(200, "invalid_response", message, headers) from exc

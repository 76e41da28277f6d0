"""OpenAI-compatible completions without HTTP: each request is one Conveyor job (same validation,
routing, quotas and queue as `/v1/jobs`), read back from its token stream, so a queued request
waits its turn instead of failing. A streamed job belongs to its listener: if the stream ends
before the job does (client gone), the job is cancelled and the engine frees its slot."""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import BaseModel, ValidationError

from producer_api.auth.key_watch import REVOKED, KeyWatch
from producer_api.auth.principal import Principal
from producer_api.errors import (
    NO_RETRY,
    ConveyorError,
    unauthorized,
)
from producer_api.jobs.protocol import PredictRequest
from producer_api.jobs.serving import JobsService, unsuccessful
from producer_api.live_feed import stop_reading, while_holds
from producer_api.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    CompletionRequest,
    EmbeddingRequest,
    Sampling,
    Usage,
)
from producer_api.state import ProducerState
from producer_api.stream_shutdown import SHUTDOWN, UNREACHABLE, Cut, until_cut
from producer_api.token_hub import TokenFollower
from shared.generate_errors import ContextLengthExceeded
from shared.job_parameters import FieldNames
from shared.job_states import JobStatus
from shared.model_repository import ModelConfig
from shared.redis_client import OUT_OF_REACH
from shared.token_stream import TokenEvent

DONE = "[DONE]"
log = logging.getLogger(__name__)
# CONVEYOR_STREAM_FIRST_EVENT_S: how long a streamed request waits for its job's first event
# before its stream opens (`open_stream`): a job that failed by then (its prompt past the
# model's context) is answered as the whole request's failure is (400, as vLLM's server refuses a
# stream's too-long prompt before opening it: OpenAI's SDK raises BadRequestError), not as a 200
# whose one chunk is the error. Past it the stream opens, its keep-alive pings flowing while the
# job waits its turn; a failure then is its error chunk. The route's keep-alive period too: a
# client waits no longer for its headers than for a ping.


@dataclass(frozen=True, slots=True)
class OpenedStream:
    """A streamed job's token events, their first read under way or done (`first`)."""

    events: AsyncGenerator[TokenEvent, None]
    first: asyncio.Future[TokenEvent]


@dataclass(slots=True)
class Generation:
    """A finished job as OpenAI reports it."""

    text: str
    finish_reason: str | None
    usage: dict[str, int] = field(default_factory=dict)


def generation_of(model: str, outputs: Any) -> Generation:
    """A finished generate job's outputs (`{text, finish_reason, usage}`) as OpenAI reports
    them; other outputs are a 502 (the job succeeded all the same)."""
    try:
        usage = Usage.model_validate(outputs["usage"]).model_dump()
        text, finish_reason = outputs["text"], outputs.get("finish_reason")
    except (TypeError, KeyError, ValidationError):
        usage, text, finish_reason = {}, None, None
    if not isinstance(text, str) or not usage or not isinstance(finish_reason, str | None):
        message = f"model {model!r} answered no `text` and `usage`, as a generate model must"
        raise ConveyorError(502, "bad_model_output", message)
    return Generation(text, finish_reason, usage)


class Renderer(ABC):
    """One endpoint's response shapes (chat or plain completion) for one job; `prompt` is the
    request's field that holds the prompt, which a refusal of its length names."""

    prefix = ""
    prompt = "prompt"

    def __init__(self, job_id: str, model: str, include_usage: bool = False) -> None:
        self.id = f"{self.prefix}{job_id}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    @abstractmethod
    def response(self, generation: Generation) -> BaseModel:
        """The whole non-streamed response."""

    def opening(self) -> BaseModel | None:
        """A chunk sent before any text (chat announces the assistant role)."""
        return None

    @abstractmethod
    def chunk(self, text: str | None, finish_reason: str | None = None) -> BaseModel:
        """A streamed chunk with new text, or the closing one with the finish reason."""

    @abstractmethod
    def usage_chunk(self, usage: Usage) -> BaseModel:
        """The last chunk when `stream_options.include_usage`: no choices, only usage."""

    def encode(self, chunk: BaseModel) -> str:
        """Chunks carry `usage: null` only when the client asked for a usage chunk."""
        return chunk.model_dump_json(exclude=None if self.include_usage else {"usage"})


class ChatRenderer(Renderer):
    prefix = "chatcmpl-"
    prompt = "messages"

    def response(self, generation: Generation) -> ChatCompletion:
        choice = ChatChoice(
            message=AssistantMessage(content=generation.text),
            finish_reason=generation.finish_reason,
        )
        return ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[choice],
            usage=Usage(**generation.usage),
        )

    def opening(self) -> ChatCompletionChunk:
        return self._chunk([ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))])

    def chunk(self, text: str | None, finish_reason: str | None = None) -> ChatCompletionChunk:
        choice = ChatChunkChoice(delta=ChatDelta(content=text), finish_reason=finish_reason)
        return self._chunk([choice])

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk:
        return self._chunk([], usage)

    def _chunk(
        self, choices: list[ChatChunkChoice], usage: Usage | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )


class CompletionRenderer(Renderer):
    """`echo`: the text a completion starts with (its prompt, when asked to echo it); streamed,
    it is the first chunk, as vLLM's server sends the prompt before the first token's text."""

    prefix = "cmpl-"

    def __init__(
        self, job_id: str, model: str, include_usage: bool = False, echo: str = ""
    ) -> None:
        super().__init__(job_id, model, include_usage)
        self.echo = echo

    def response(self, generation: Generation) -> Completion:
        text = self.echo + generation.text
        choice = CompletionChoice(text=text, finish_reason=generation.finish_reason)
        return self._completion([choice], Usage(**generation.usage))

    def opening(self) -> Completion | None:
        return self.chunk(self.echo) if self.echo else None

    def chunk(self, text: str | None, finish_reason: str | None = None) -> Completion:
        return self._completion([CompletionChoice(text=text or "", finish_reason=finish_reason)])

    def usage_chunk(self, usage: Usage) -> Completion:
        return self._completion([], usage)

    def _completion(
        self, choices: list[CompletionChoice], usage: Usage | None = None
    ) -> Completion:
        return Completion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )


def _failure(final: TokenEvent, renderer: Renderer) -> ConveyorError:
    """A generation's failed final as its route answers it, its prompt's field named."""
    return job_failure("job", final.status, final.error, renderer.prompt)


def job_failure(
    subject: str, status: str, error: dict[str, Any] | None, prompt: str
) -> ConveyorError:
    """As `/predict` answers a job (`subject`) that did not succeed; but an input past the
    model's context (a prompt, a text to embed) as vLLM's server refuses it, 400 (OpenAI's
    `invalid_request_error`) naming the input's field (`prompt`), with the context's length and
    the input's: it was the failed job's 422, which OpenAI's SDK raises as
    UnprocessableEntityError, not BadRequestError."""
    if context_exceeded(error):
        message = (error or {}).get("message", "")
        return ConveyorError(400, "invalid_request", message, param=prompt)
    return unsuccessful(subject, status, error)


def context_exceeded(error: dict[str, Any] | None) -> bool:
    """Whether a failed job's `error` is its input past the model's context."""
    return (error or {}).get("type") == ContextLengthExceeded.__name__


def _failed_first(first: asyncio.Future[TokenEvent], renderer: Renderer) -> ConveyorError | None:
    """The request's error when the job's first event, already read, is a failed end; None for
    anything else (no event yet, a token, a read that raised: the stream meets that itself)."""
    if not first.done() or first.cancelled() or first.exception() is not None:
        return None
    event = first.result()
    if event.kind != "final" or event.status == JobStatus.SUCCEEDED:
        return None
    return _failure(event, renderer)


def running_on(job_id: str, reason: str = SHUTDOWN.reason) -> ConveyorError:
    """What a request waiting for its whole answer gets once the producer is asked to stop
    (producer_api/draining.py) or Redis stops answering: 503, the job running on, named in it.
    Not to be retried: an OpenAI SDK retries a 503 unless told not to, and each retry ran the
    job again."""
    headers = {"Retry-After": "1", **NO_RETRY}
    return ConveyorError(503, "unavailable", _runs_on(reason, job_id), headers, {"job": job_id})


@contextmanager
def awaiting(job_id: str) -> Iterator[None]:
    """A wait for an enqueued job's answer: Redis lost meanwhile is `running_on`'s 503, not the
    generic one, which asks to be retried."""
    try:
        yield
    except OUT_OF_REACH as exc:
        log.info("an answer's wait ends early: redis unavailable (%r)", exc)
        raise running_on(job_id, UNREACHABLE.reason) from exc


def _runs_on(reason: str, job_id: str) -> str:
    return f"{reason}; the job runs on: GET /v1/jobs/{job_id}"


class OpenAIService:
    def __init__(self, state: ProducerState, principal: Principal) -> None:
        self.state = state
        self.principal = principal
        self.jobs = JobsService(state, principal)

    def usable(self, model: str) -> ModelConfig | None:
        """The model's config if it is known and the key may use it; else None: the submit
        answers (404, 403), before any 400 about what the model can do (which told a key what
        kind a model it may not use is)."""
        config = self.state.repository.get(model)
        return config if config is not None and self.principal.may_use(model) else None

    def check_serves(
        self, model: str, serves: Callable[[ModelConfig], bool], what: str
    ) -> ModelConfig | None:
        """A usable model the route cannot run is a 400 naming `model`, as OpenAI's API refuses
        an embedding model on its chat route; returns the usable model's config (None for one
        the submit will refuse)."""
        if (config := self.usable(model)) is not None and not serves(config):
            message = f"model {model!r} does not {what}; use /v1/jobs"
            raise ConveyorError(400, "invalid_request", message, param="model")
        return config

    async def submit(self, request: Sampling) -> str:
        """Enqueue the request as a job of a `generate` model; returns its id."""
        return await self.submit_as_sent(request, self.sampling_job(request))

    async def submit_as_sent(
        self, request: Sampling | EmbeddingRequest, job: PredictRequest
    ) -> str:
        """Enqueue `job`, made of `request`; returns its id. A refusal names the job's fields as
        the request's client sent them (`max_completion_tokens`, `prompt`, not the job's
        `parameters.max_tokens`, `inputs['prompt']`)."""
        jobs = JobsService(self.state, self.principal, request.field_names())
        return (await jobs.submit(request.model, job)).job_id

    def sampling_job(self, request: Sampling) -> PredictRequest:
        """The job a chat or completion request is (a batch line's too)."""
        self.check_serves(request.model, lambda config: config.kind == "generate", "generate text")
        return PredictRequest(
            inputs=request.inputs(),
            parameters=request.parameters(),
            routing_key=request.user,
            variant=request.variant,
        )

    def sampling_line(
        self, kind: type[Sampling], body: dict[str, Any]
    ) -> tuple[str, PredictRequest, FieldNames]:
        """A batch line's body (`url: /v1/chat/completions` or `/v1/completions`) as the job it
        is, with its model and how a refusal names its fields. A batch line is answered whole:
        `stream` is refused; and from its job's outputs alone: a completion's `echo` too."""
        request = kind.model_validate(body)
        if request.stream:
            message = "stream: a batch line is answered whole, in the output file"
            raise ConveyorError(400, "invalid_request", message)
        if isinstance(request, CompletionRequest) and request.echo:
            message = "echo: a batch line's completion is answered without its prompt"
            raise ConveyorError(400, "invalid_request", message)
        return request.model, self.sampling_job(request), request.field_names()

    def _follow(self, job_id: str) -> AsyncGenerator[TokenEvent, None]:
        return TokenFollower(self.state.tokens, self.state.job_store, self.state.keys).follow(
            job_id
        )

    async def answer(self, job_id: str, renderer: Renderer) -> dict[str, Any]:
        """The whole (non-streamed) response, once the job ends; 503 if this producer is asked
        to stop first (it waited out the whole generation): the job runs on, named in it."""
        with awaiting(job_id):
            generation = await self.state.draining.first(self.complete(job_id, renderer))
        if generation is None:
            raise running_on(job_id)
        return renderer.response(generation).model_dump(mode="json")

    async def complete(self, job_id: str, renderer: Renderer) -> Generation:
        """Wait for the job by reading its token stream; raises if it did not succeed."""
        text: list[str] = []
        async with aclosing(self._follow(job_id)) as events:  # its hub listener goes with it
            async for event in events:
                if event.kind == "restart":
                    text.clear()
                elif event.kind == "token":
                    text.append(event.text)
                elif event.status != JobStatus.SUCCEEDED:
                    raise _failure(event, renderer)
                else:
                    return Generation("".join(text), event.finish_reason, event.usage)
        raise ConveyorError(404, "not_found", f"job {job_id} expired")

    async def open_stream(
        self, job_id: str, renderer: Renderer, wait_s: float | None = None
    ) -> OpenedStream:
        """The job's token events once its first came, `wait_s` passed or the producer is
        asked to stop; raises the request's error, as a whole answer does, when that first
        event says the job failed (`wait_s`: CONVEYOR_STREAM_FIRST_EVENT_S unless given). Its
        key is looked at every CONVEYOR_STREAM_RECHECK_S meanwhile, as the open stream's is:
        found revoked or expired, the job is cancelled and the request answered 401 before
        any byte is sent (a queued job's wait outlived the key by up to its whole length)."""
        if wait_s is None:
            wait_s = self.state.settings.stream_first_event_s
        events = self._follow(job_id)
        first = asyncio.ensure_future(anext(events))
        watch = KeyWatch(self.state.api_keys, self.principal)
        try:
            recheck_s = self.state.settings.stream_recheck_s
            await self.state.draining.first(watch.wait(first, recheck_s), wait_s)
            if watch.revoked:
                await self.cancel(job_id)
                raise _revoked(job_id)
            if (failure := _failed_first(first, renderer)) is not None:
                raise failure
        except BaseException:  # that, the client gone (`unless_disconnected`), a stop
            await stop_reading(events, first)
            raise
        return OpenedStream(events, first)

    async def stream(
        self, job_id: str, opened: OpenedStream, renderer: Renderer, shutdown: anyio.Event
    ) -> AsyncIterator[str]:
        """The job's chunks in OpenAI's format, ending with `[DONE]`. A stream that stops
        before the job's final event (client disconnected) cancels the job; one cut by this
        producer's shutdown or by Redis not answering ends with an error chunk and `[DONE]`,
        and its job runs on. A restart (the job's worker died and another runs it again) ends
        the stream only once text was sent: before, nothing is to be taken back. A key revoked
        or expired meanwhile ends it within CONVEYOR_STREAM_RECHECK_S with an `unauthorized` error
        chunk and `[DONE]`, and cancels its job. A token stream that expired before this stream
        read it to its end, text sent, ends it with a `stream_expired` error chunk (`_taken_back`).
        Ended or closed, it lets go of the job's token stream at once (`_let_go`): left to
        asyncio's finalizer, its listener stayed in the token hub, which read the stream on for no
        one; closed at its opening chunk, for as long as the job sent nothing."""
        ended, sent = False, False
        watch = KeyWatch(self.state.api_keys, self.principal)
        try:
            if (opening := renderer.opening()) is not None:
                yield renderer.encode(opening)
            recheck_s = self.state.settings.stream_recheck_s
            held = while_holds(opened.events, watch.holds, recheck_s, opened.first)
            async with aclosing(until_cut(held, shutdown)) as events:
                async for event in events:
                    if isinstance(event, Cut):
                        if not ended:  # after the final event, the stream is whole: no error
                            ended = True  # not the client's choice: the job runs on
                            yield _error_chunk("unavailable", _cut(event, job_id))
                        break
                    if event.kind == "restart" and sent:
                        ended = event.retold  # the job is over: nothing to cancel
                        yield _taken_back(event, job_id)
                        break
                    if event.kind == "token" and event.text:  # a step's tokens alone: no chunk
                        sent = True
                        yield renderer.encode(renderer.chunk(event.text))
                    if event.kind != "final":
                        continue
                    ended = True
                    for chunk in self._closing(renderer, event):
                        yield chunk
            if watch.revoked:
                yield _failure_chunk(_revoked(job_id))
            yield DONE
        finally:
            with anyio.CancelScope(shield=True):
                await self._let_go(job_id, opened, ended)

    async def _let_go(self, job_id: str, opened: OpenedStream, ended: bool) -> None:
        """A stream's end: its job cancelled unless it `ended`, then its token events closed.
        They close with the stream's `events` once it read them; not so if it was closed
        before (at its opening chunk, its first read still waiting in the hub)."""
        try:
            if not ended:
                await self.cancel(job_id)
        finally:
            await stop_reading(opened.events, opened.first)

    def _closing(self, renderer: Renderer, final: TokenEvent) -> list[str]:
        if final.status != JobStatus.SUCCEEDED:
            return [_failure_chunk(_failure(final, renderer))]
        chunks = [renderer.encode(renderer.chunk(None, final.finish_reason))]
        if renderer.include_usage and final.usage:
            chunks.append(renderer.encode(renderer.usage_chunk(Usage(**final.usage))))
        return chunks

    async def cancel(self, job_id: str) -> None:
        """Cancel a job nobody listens to any more; one that already ended stays as it is, and
        one whose record is gone (expired) needs none."""
        try:
            await self.jobs.cancel(job_id)
        except ConveyorError as exc:
            if exc.status not in (404, 409):
                raise


def _revoked(job_id: str) -> ConveyorError:
    """A request's end once its key is found revoked or expired, its job cancelled: the whole
    answer of one still waiting for its first event, an open stream's last error chunk: the 401
    a request with that key gets at the door (`invalid_api_key` on these routes)."""
    return unauthorized(f"{REVOKED}; job {job_id} cancelled")


def _taken_back(restart: TokenEvent, job_id: str) -> str:
    """The error chunk of a restart after text was sent, which a stream cannot take back: the
    job's worker died and another runs it again, or (`retold`) its token stream expired before
    this slow reader read it to its end, and the text sent is cut short; the job's whole text
    is in its result."""
    if restart.retold:
        message = "the job's token stream expired before this stream read it to its end"
        return _error_chunk("stream_expired", f"{message}; its whole text: GET /v1/jobs/{job_id}")
    return _error_chunk("restarted", "the job's worker died; retry the request")


def _cut(cut: Cut, job_id: str) -> str:
    """A cut stream's error: why, without the job-events route's advice (an OpenAI stream is
    not resumed), and where the job that runs on is answered."""
    return _runs_on(cut.reason, job_id)


def _failure_chunk(failure: ConveyorError) -> str:
    """An error's chunk, as its unstreamed answer's body: a failed job's (a prompt past the
    context: `invalid_request_error` naming the field, which OpenAI's SDK reads into its error's
    `type` and `param`), a revoked key's (`code` `invalid_api_key`, as its 401's)."""
    return failure.as_openai().model_dump_json()


def _error_chunk(type_: str, message: str) -> str:
    """Conveyor's error in the fields of OpenAI's error object, `param` null and `code`
    OpenAI's where it has one (`OPENAI_CODES`), as vLLM's server sends a stream's error: a
    client reading `error["code"]` failed on its absence. A stream's status went out with its
    first byte: the error's is none of the chunk's."""
    return _failure_chunk(ConveyorError(500, type_, message))

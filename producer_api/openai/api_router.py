"""HTTP routes of the OpenAI-compatible resource: parse, submit the job, answer with the whole
completion or stream its chunks (`text/event-stream`, `data: [DONE]` last), or with the
embeddings."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import Response

from producer_api.auth import AUTH_RESPONSES, acting_for
from producer_api.client_disconnect import (
    CLIENT_CLOSED_REQUEST,
    ClientDisconnected,
    unless_disconnected,
)
from producer_api.errors import ErrorBody, OpenAIErrorBody, error_responses
from producer_api.jobs.serving import UNSUCCESSFUL_DESCRIPTIONS
from producer_api.openai import CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH
from producer_api.openai.embedding_serving import EmbeddingService
from producer_api.openai.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    EmbeddingList,
    EmbeddingRequest,
    Sampling,
)
from producer_api.openai.serving import (
    ChatRenderer,
    CompletionRenderer,
    OpenAIService,
    OpenedStream,
    Renderer,
)
from producer_api.responses import FastJSONResponse
from producer_api.state import ProducerState, producer_state
from producer_api.stream_shutdown import BoundedEventSource

router = APIRouter(tags=["openai"])
JOB_HEADER = "X-Conveyor-Job-Id"
# OpenAI's own: its SDK reads it as a response's `_request_id`, the id its users log and quote
REQUEST_ID_HEADER = "X-Request-ID"
T = TypeVar("T")

_DESCRIPTIONS = {
    413: "Body over CONVEYOR_MAX_BODY_BYTES (chunked too)",
    429: "Queue full, rate limited or too many jobs in flight; see Retry-After",
    503: "Queue unreachable",
}
_FAILED = {422: "The model failed on the request"}


def _invalid(what: str) -> dict[int | str, dict[str, Any]]:
    """The 400 of an invalid request, in OpenAI's shape (`producer_api.errors.ErrorResponse`)."""
    return {400: {"model": OpenAIErrorBody, "description": f"Invalid request: {what}"}}


# An unknown model as OpenAI's API answers it (`producer_api.errors.unknown_model`); an unknown
# variant, a field of Conveyor's own, Conveyor's `not_found` in OpenAI's fields (ErrorBody's
# `type` and `message` among them).
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {
        "model": OpenAIErrorBody | ErrorBody,
        "description": "Unknown model (OpenAI's shape, `code` model_not_found) or variant",
    }
}


def _as_openais(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """The responses, each with OpenAI's error body: every error of OpenAI's routes is in
    OpenAI's shape (`producer_api.errors.ErrorResponse`)."""
    return {code: {**response, "model": OpenAIErrorBody} for code, response in responses.items()}


_RESPONSES: dict[int | str, dict[str, Any]] = {
    **_as_openais(
        {**AUTH_RESPONSES, **error_responses(_DESCRIPTIONS | UNSUCCESSFUL_DESCRIPTIONS | _FAILED)}
    ),
    **_NOT_FOUND,
    **_invalid(
        "a malformed body or parameter, a model that does not generate text, or a prompt past"
        " the model's context"
    ),
}
_EMBEDDING_RESPONSES = {
    **_RESPONSES,
    **_as_openais(
        error_responses(
            {502: "The model's outputs lack the `embeddings` and `usage` of a model of task embed"}
        )
    ),
    **_invalid("a malformed body, a model that does not embed text, or `dimensions`"),
}


Service = Annotated[OpenAIService, Depends(acting_for("submit", OpenAIService))]
State = Annotated[ProducerState, Depends(producer_state)]
Embedder = Annotated[EmbeddingService, Depends(acting_for("submit", EmbeddingService))]


def _job_headers(job_id: str) -> dict[str, str]:
    """The job's id, under Conveyor's name and as OpenAI's request id."""
    return {JOB_HEADER: job_id, REQUEST_ID_HEADER: job_id}


async def _whole(
    request: Request, service: OpenAIService, job_id: str, answer: Coroutine[Any, Any, Any]
) -> Response:
    """`answer` once the job ends, or 499 when the client went away first."""
    headers = _job_headers(job_id)
    return await _unless_gone(
        request, service, job_id, answer, lambda body: FastJSONResponse(body, headers=headers)
    )


async def _unless_gone(
    request: Request,
    service: OpenAIService,
    job_id: str,
    work: Coroutine[Any, Any, T],
    respond: Callable[[T], Response],
) -> Response:
    """`respond` to `work`'s result, or 499 when the client went away first: then its job is
    cancelled, so the engine does not work for nobody."""
    try:
        result = await unless_disconnected(request, work)
    except ClientDisconnected:
        with anyio.CancelScope(shield=True):  # the server may be cancelling this handler
            await service.cancel(job_id)
        return Response(status_code=CLIENT_CLOSED_REQUEST, headers=_job_headers(job_id))
    return respond(result)


async def _answer(
    request: Request,
    state: ProducerState,
    service: OpenAIService,
    body: Sampling,
    renderer_of: Callable[[str], Renderer],
) -> Response:
    """Interactive requests, run as a job: a client that goes away (stream closed early, or
    the whole answer no longer awaited) cancels its job. `renderer_of` gives the job's renderer
    from its id."""
    job_id = await service.submit(body)
    renderer = renderer_of(job_id)
    if not body.stream:
        return await _whole(request, service, job_id, service.answer(job_id, renderer))
    shutdown = anyio.Event()

    def streaming(opened: OpenedStream) -> Response:
        return BoundedEventSource(
            service.stream(job_id, opened, renderer, shutdown),
            # a stream waits no longer for its first event than for a ping
            ping=state.settings.stream_first_event_s,
            headers=_job_headers(job_id),
            shutdown_event=shutdown,
            shutdown_grace_period=state.settings.stream_shutdown_grace_s,
        )

    return await _unless_gone(
        request, service, job_id, service.open_stream(job_id, renderer), streaming
    )


@router.post(CHAT_PATH, response_model=ChatCompletion, responses=_RESPONSES)
async def chat_completions(
    request: Request, body: ChatCompletionRequest, state: State, service: Service
) -> Response:
    """OpenAI's chat completion, run as a Conveyor job (its id in `X-Conveyor-Job-Id`); with
    `stream: true`, chunks as server-sent events. A client that disconnects before the answer
    (streamed or not) cancels the job."""
    return await _answer(
        request,
        state,
        service,
        body,
        lambda job: ChatRenderer(job, body.model, body.include_usage),
    )


@router.post(COMPLETIONS_PATH, response_model=Completion, responses=_RESPONSES)
async def completions(
    request: Request, body: CompletionRequest, state: State, service: Service
) -> Response:
    """OpenAI's (legacy) text completion of a raw prompt, run as a Conveyor job; with `echo`,
    the prompt comes first."""

    def renderer_of(job_id: str) -> CompletionRenderer:
        return CompletionRenderer(job_id, body.model, body.include_usage, body.echoed())

    return await _answer(request, state, service, body, renderer_of)


@router.post(EMBEDDINGS_PATH, response_model=EmbeddingList, responses=_EMBEDDING_RESPONSES)
async def embeddings(request: Request, body: EmbeddingRequest, service: Embedder) -> Response:
    """OpenAI's embeddings of one text or a list, run as one Conveyor job of a `task: embed`
    model (its id in `X-Conveyor-Job-Id`); `encoding_format: base64` gives each vector as its
    little-endian float32 bytes. A client that disconnects before the answer cancels the job."""
    job_id = await service.submit_texts(body)
    return await _whole(request, service, job_id, service.embedded(job_id, body.model))

"""HTTP routes of the Batch API resource: parse, call BatchApiService, return."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.datastructures import UploadFile

from producer_api.auth import AUTH_RESPONSES, Principal, acting_for
from producer_api.batch_api.progress import batch_url, view
from producer_api.batch_api.protocol import (
    WINDOW,
    BatchLine,
    BatchList,
    BatchOptions,
    BatchView,
    Endpoint,
)
from producer_api.batch_api.serving import Asked, BatchApiService
from producer_api.errors import (
    ConveyorError,
    OpenAIErrorBody,
    answer_as_openai,
    mark_as_openai,
)
from producer_api.files.serving import FilesService
from producer_api.jobs.api_router import KEY_PARAMETER, LOCATED, idempotency_key, link_base
from producer_api.request_boundary import parse_json
from producer_api.responses import FastJSONResponse, JsonlResponse, jsonl_route, page_response
from producer_api.state import ProducerState
from shared.batch_api_store import Refresh
from shared.file_expiry import EXPIRES_AFTER_MAX_S, EXPIRES_AFTER_MIN_S
from shared.model_names import NAME
from shared.settings import get_settings

router = APIRouter(tags=["batches"])
BATCH_ID = Path(max_length=64, description="Batch id")
# Bodies the request boundary leaves to lines.py, which checks each line as it checks JSON.
JSONL_UPLOADS = frozenset({"/v1/batches"})

_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    400: {
        "model": OpenAIErrorBody,
        "description": "A multipart body that does not parse; an invalid request to OpenAI's "
        "create (a JSON body naming `input_file_id`), list, retrieve or cancel, in OpenAI's shape",
    },
    404: {"description": "Unknown batch or model"},
    409: {
        "description": "Batch not running (cancel) or not ended (files); for a create, its "
        "Idempotency-Key reused with another request, or its first request still being created "
        "after 5 s (Retry-After)"
    },
    413: {
        "description": "Body over CONVEYOR_MAX_UPLOAD_BYTES, or more lines than "
        "CONVEYOR_MAX_BATCH_LINES"
    },
    422: {
        "description": "No lines, bad options, or a webhook URL outside the allow-list, for a "
        "create that sends its lines (a JSONL body or a multipart file)"
    },
    503: {"description": "Queue unreachable"},
}


@dataclass(frozen=True, slots=True)
class BatchCreation:
    """The services a create acts through, its caller admitted once: each `acting_for`
    dependency takes a rate-limit token, so a create that took two services cost two tokens,
    and a key with a burst of one could never create a batch."""

    batches: BatchApiService
    files: FilesService

    @classmethod
    def of(cls, state: ProducerState, principal: Principal) -> BatchCreation:
        return cls(BatchApiService(state, principal), FilesService(state, principal))


SubmitService = Annotated[BatchApiService, Depends(acting_for("submit", BatchApiService))]
Creation = Annotated[BatchCreation, Depends(acting_for("submit", BatchCreation.of))]
ReadService = Annotated[BatchApiService, Depends(acting_for("read", BatchApiService))]
# OpenAI's reads of a batch: their refusals answer in OpenAI's shape.
OPENAI_ROUTE = [Depends(answer_as_openai)]


def _respond(request: Request, batch_id: str, progress: Refresh, status: int = 200) -> Any:
    """The batch; a create's 202 names it in `Location` too, as the jobs' 202 does."""
    base = batch_url(link_base(request), batch_id)
    headers = {"Location": base} if status == 202 else None
    return FastJSONResponse(view(batch_id, progress, base), status_code=status, headers=headers)


async def _asked(request: Request, options: dict[str, Any]) -> Asked:
    """The create as sent: the JSONL as the raw body, as the `file` field of a multipart form
    whose other fields are the options, or OpenAI's JSON body naming an uploaded file
    (`input_file_id`, with `endpoint`, `completion_window` and `metadata`)."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await request.form()
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ConveyorError(422, "invalid_request", "multipart body needs a `file` field")
        fields = {k: v for k, v in form.items() if k != "file" and isinstance(v, str)}
        return Asked(await upload.read(), {**options, **_folded(fields)})
    if (create := _openai_create(request, body := await request.body())) is not None:
        return Asked(None, {**options, **create})
    return Asked(body, options)


# OpenAI's `output_expires_after` and `metadata` as the flat query parameters or form fields
# that send them where the options are not a JSON body, as an upload's `expires_after[...]` form
# fields (`POST /v1/files`): each policy field's name to its key in the object, and
# `metadata[KEY]=VALUE` per pair.
_EXPIRES_AFTER = "output_expires_after"
_EXPIRES_FIELDS = {f"{_EXPIRES_AFTER}[anchor]": "anchor", f"{_EXPIRES_AFTER}[seconds]": "seconds"}
_METADATA = "metadata"


def _metadata_key(name: str) -> str | None:
    """KEY of a `metadata[KEY]` field; None for another field."""
    if name.startswith(f"{_METADATA}[") and name.endswith("]"):
        return name[len(_METADATA) + 1 : -1]
    return None


def _folded(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` with `output_expires_after[anchor]` and `[seconds]` as one `output_expires_after`
    object and the `metadata[KEY]` fields as one `metadata` object, which `BatchOptions` checks
    as it checks OpenAI's JSON create's (a policy field left out is named missing there, not
    taken as a default; more than 16 pairs, a key past 64 characters or a value past 512 are
    refused by name)."""
    kept: dict[str, Any] = {}
    policy: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    for name, value in fields.items():
        if name in _EXPIRES_FIELDS:
            policy[_EXPIRES_FIELDS[name]] = value
        elif (key := _metadata_key(name)) is not None:
            metadata[key] = value
        else:
            kept[name] = value
    objects = {_EXPIRES_AFTER: policy, _METADATA: metadata}
    return kept | {name: value for name, value in objects.items() if value}


# What only OpenAI's create body holds, and what only a batch line does.
_CREATE_FIELDS = frozenset(BatchOptions.model_fields)
_LINE_FIELDS = frozenset(BatchLine.model_fields)


def _openai_create(request: Request, body: bytes) -> dict[str, Any] | None:
    """OpenAI's create body, a JSON object naming `input_file_id`; None for JSONL (which a
    one-line batch sent as `application/json` also is). An object with a create's fields and
    none of a line's is a create that left its file out: refused, where it ran as a one-line
    batch whose one line was invalid (a 202, the batch `failed`). OpenAI's create is refused in
    OpenAI's shape, as its SDK expects (`answer_as_openai`)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return None
    try:
        value = parse_json(body, get_settings().max_json_depth)
    except ValueError:
        return None
    if not isinstance(value, dict) or not value.keys() & _CREATE_FIELDS:
        return None
    if "input_file_id" not in value and value.keys() & _LINE_FIELDS:
        return None
    mark_as_openai(request)
    if value.get("input_file_id") is not None:  # a null one is left out too
        return value
    message = (
        "input_file_id is required: OpenAI's create names an uploaded file (POST /v1/files, "
        "purpose batch); send the lines themselves as application/jsonl"
    )
    raise ConveyorError(422, "invalid_request", message, param="input_file_id")


@router.post(
    "/v1/batches",
    status_code=202,
    response_model=BatchView,
    responses={202: {"headers": LOCATED}, **_ERRORS},
    openapi_extra={"parameters": [KEY_PARAMETER]},
)
async def create_batch(
    request: Request,
    creation: Creation,
    model: str | None = Query(
        default=None, pattern=NAME, description="Model for lines that name none"
    ),
    completion_window: str = Query(default="24h", pattern=WINDOW),
    webhook: str | None = Query(default=None, max_length=2048),
    endpoint: Annotated[Endpoint | None, Query(description="The url every line names")] = None,
    # checked only: OpenAI's one anchor, each file's `created_at`
    anchor: Annotated[
        Literal["created_at"] | None, Query(alias=f"{_EXPIRES_AFTER}[anchor]")
    ] = None,
    seconds: Annotated[
        int | None,
        Query(
            alias=f"{_EXPIRES_AFTER}[seconds]",
            ge=EXPIRES_AFTER_MIN_S,
            le=EXPIRES_AFTER_MAX_S,
            description="OpenAI's output_expires_after: how long the batch's output and error "
            "files are kept from its end, the result TTL at most",
        ),
    ] = None,
) -> Any:
    """Create a batch from JSONL (`application/jsonl` body, a multipart `file` upload with
    the same options as form fields, or OpenAI's JSON body naming an uploaded `input_file_id`).
    OpenAI's `output_expires_after` is `output_expires_after[anchor]=created_at` and
    `output_expires_after[seconds]` as query parameters or form fields, as `POST /v1/files`
    takes an upload's `expires_after`, and its `metadata` one `metadata[KEY]=VALUE` each.
    One line per request: `{"custom_id", "body": {job}}`, or `{"custom_id", "url", "body"}` for
    OpenAI's `/v1/embeddings`, `/v1/chat/completions` or `/v1/completions`, `body` being that
    route's request (one url per batch).
    Invalid lines go to the errors file with their line number and reason; the rest run on
    the bulk lane, those it has no room for held and fed in as it frees. A repeated
    `Idempotency-Key` with the same request answers as its first try did, 202 with the batch it
    created (as `POST /v1/jobs` answers with its job)."""
    options = {
        "model": model,
        "completion_window": completion_window,
        "webhook": webhook,
        "endpoint": endpoint,
        f"{_EXPIRES_AFTER}[anchor]": anchor,
        f"{_EXPIRES_AFTER}[seconds]": seconds,
    }
    # OpenAI's `metadata` pairs, as `metadata[KEY]=VALUE` query parameters (no declared name)
    pairs = {k: v for k, v in request.query_params.items() if _metadata_key(k) is not None}
    given = _folded({**{k: v for k, v in options.items() if v is not None}, **pairs})
    asked = await _asked(request, given)  # first: it tells OpenAI's create, refused as OpenAI's
    key = idempotency_key(request)
    batch_id, progress = await creation.batches.create(asked, creation.files.data, key)
    return _respond(request, batch_id, progress, 202)


@router.get("/v1/batches", response_model=BatchList, responses=_ERRORS, dependencies=OPENAI_ROUTE)
async def list_batches(
    request: Request,
    service: ReadService,
    after: Annotated[
        str | None, Query(max_length=64, description="A batch id: list from the one after it")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Any:
    """The tenant's batches, newest first (OpenAI's list: `has_more`, `after` = `last_id`)."""
    page = await service.list(after, limit)
    base = link_base(request)
    data = [
        view(batch_id, progress, batch_url(base, batch_id)) for batch_id, progress in page.found
    ]
    return page_response(data, page.more)


@router.get(
    "/v1/batches/{batch_id}",
    name="get_batch",
    response_model=BatchView,
    responses=_ERRORS,
    dependencies=OPENAI_ROUTE,
)
async def get_batch(request: Request, service: ReadService, batch_id: str = BATCH_ID) -> Any:
    """State, counts (total = succeeded + failed + pending) and timestamps."""
    return _respond(request, batch_id, await service.get(batch_id))


@router.post(
    "/v1/batches/{batch_id}/cancel",
    response_model=BatchView,
    responses=_ERRORS,
    dependencies=OPENAI_ROUTE,
)
async def cancel_batch(request: Request, service: SubmitService, batch_id: str = BATCH_ID) -> Any:
    """Cancel what has not finished; the batch ends `cancelled` (409 if it already ended)."""
    return _respond(request, batch_id, await service.cancel(batch_id))


@router.get("/v1/batches/{batch_id}/output", **jsonl_route(_ERRORS))
async def batch_output(service: ReadService, batch_id: str = BATCH_ID) -> JsonlResponse:
    """JSONL, one line per succeeded item in input order: `{id, custom_id, line, outputs}`;
    for a batch of lines for one of OpenAI's routes, OpenAI's `{id, custom_id, line, response:
    {status_code, request_id, body}, error}`, `body` being the route's answer."""
    return JsonlResponse(await service.file(batch_id, "output"))


@router.get("/v1/batches/{batch_id}/errors", **jsonl_route(_ERRORS))
async def batch_errors(service: ReadService, batch_id: str = BATCH_ID) -> JsonlResponse:
    """JSONL, one line per line that did not succeed, in input order: `{custom_id, line,
    status, error: {type, message}}` (and the job `id` where the line became one)."""
    return JsonlResponse(await service.file(batch_id, "errors"))

"""HTTP routes of the files resource: parse, call FilesService, return."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, File, Form, Path, Query, Response, UploadFile

from producer_api.auth import AUTH_RESPONSES, acting_for
from producer_api.batch_api.progress import batch_file_name
from producer_api.errors import OpenAIErrorBody, OpenAIRoute
from producer_api.files.protocol import FileDeleted, FileList, FileObject
from producer_api.files.serving import FilesService, check_purpose, expires_after_s
from producer_api.responses import (
    JSONL,
    FastJSONResponse,
    JsonlResponse,
    jsonl_route,
    page_response,
)
from shared.file_expiry import EXPIRES_AFTER_MAX_S, EXPIRES_AFTER_MIN_S
from shared.file_store import StoredFile

# OpenAI's Files API, every route of it: its refusals answer in OpenAI's shape.
router = APIRouter(tags=["files"], route_class=OpenAIRoute)
FILE_ID = Path(max_length=64, description="A file id, or a batch's output_file_id / error_file_id")
EXPIRES_AFTER = "OpenAI's expires_after: seconds from created_at, kept the result TTL at most"
# Bodies held to CONVEYOR_MAX_UPLOAD_BYTES rather than CONVEYOR_MAX_BODY_BYTES (request_boundary).
FILE_UPLOADS = frozenset({"/v1/files"})
PAGE_MAX = 100  # files a page holds at most: each is looked up (OpenAI's `limit` goes to 10,000)

_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    400: {
        "model": OpenAIErrorBody,
        "description": "A multipart body that does not parse; no file, an empty one, a filename "
        "over 255 bytes, a purpose not batch, or another invalid parameter (OpenAI's shape)",
    },
    404: {
        "description": "Unknown file (or another tenant's), or a batch's output or errors file "
        "its view does not name (`output_file_id` / `error_file_id` null: no line in it)"
    },
    409: {"description": "The batch whose file it is has not ended"},
    413: {"description": "Body over CONVEYOR_MAX_UPLOAD_BYTES"},
    429: {"description": "The tenant's files would pass its storage budget (not retried)"},
    503: {"description": "Store unreachable"},
}

Uploads = Annotated[FilesService, Depends(acting_for("submit", FilesService))]
ReadService = Annotated[FilesService, Depends(acting_for("read", FilesService))]


@router.post("/v1/files", response_model=FileObject, responses=_ERRORS)
async def upload_file(
    service: Uploads,
    file: Annotated[UploadFile, File(description="JSONL of batch lines")],
    purpose: Annotated[str, Form(max_length=64, json_schema_extra={"enum": ["batch"]})],
    # OpenAI's one anchor, the upload's `created_at`, sent with `seconds`
    anchor: Annotated[Literal["created_at"] | None, Form(alias="expires_after[anchor]")] = None,
    seconds: Annotated[
        int | None,
        Form(
            alias="expires_after[seconds]",
            ge=EXPIRES_AFTER_MIN_S,
            le=EXPIRES_AFTER_MAX_S,
            description=EXPIRES_AFTER,
        ),
    ] = None,
) -> Any:
    """Upload a batch input file (OpenAI's Files API; purpose `batch` only), kept for the
    result TTL or OpenAI's `expires_after` if shorter (`expires_at` says which); `POST
    /v1/batches` takes its id as `input_file_id`."""
    check_purpose(purpose)
    asked_s = expires_after_s(anchor, seconds)
    data = await file.read()
    return FastJSONResponse(await service.upload(file.filename or "batch.jsonl", data, asked_s))


@router.get("/v1/files", response_model=FileList, responses=_ERRORS)
async def list_files(
    service: ReadService,
    after: Annotated[
        str | None, Query(max_length=64, description="A file id: list from the one after it")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Annotated[Literal["asc", "desc"], Query(description="By upload time")] = "desc",
    purpose: Annotated[str | None, Query(max_length=64)] = None,
) -> Any:
    """The tenant's uploaded files (OpenAI's list: `has_more`, `after` = `last_id`), at most
    100 a page whatever the `limit` (each is looked up); every one has purpose `batch`, so
    another `purpose` lists none. A batch's output and errors files are read by the ids its
    view gives, not listed."""
    if purpose not in (None, "batch"):
        return page_response([], False)
    page = await service.list(after, min(limit, PAGE_MAX), order == "desc")
    return page_response([file for _, file in page.found], page.more)


@router.get("/v1/files/{file_id}", response_model=FileObject, responses=_ERRORS)
async def get_file(service: ReadService, file_id: str = FILE_ID) -> Any:
    """An uploaded file's size, name and purpose, or an ended batch's output or errors file's
    (409 before it ends)."""
    return FastJSONResponse(await service.get(file_id))


@router.delete("/v1/files/{file_id}", response_model=FileDeleted, responses=_ERRORS)
async def delete_file(service: Uploads, file_id: str = FILE_ID) -> Any:
    """Forget an uploaded file (a batch made from it keeps its lines); a batch's output and
    errors files go with the batch (`deleted: false`)."""
    return FastJSONResponse(await service.delete(file_id))


@router.get("/v1/files/{file_id}/content", **jsonl_route(_ERRORS))
async def file_content(service: ReadService, file_id: str = FILE_ID) -> Response:
    """An uploaded file's bytes with their Content-Length (a client can tell a cut download
    from a whole one), or an ended batch's output or errors file streamed (JSONL); either
    named in a Content-Disposition (`attachment`)."""
    content = await service.content(file_id)
    if isinstance(content, StoredFile):
        return Response(content.data, media_type=JSONL, headers=attachment(content.filename))
    batch_id, _, kind = file_id.rpartition("-")  # a batch's file: `{batch id}-{kind}`
    return JsonlResponse(content, headers=attachment(batch_file_name(batch_id, kind)))


def attachment(filename: str) -> dict[str, str]:
    """RFC 6266's Content-Disposition, so a browser or `curl -OJ` saves a download under its
    name: `filename*` the name (UTF-8, percent-encoded), `filename` an ASCII stand-in
    for clients that read only that. Sent raw, a quote, a backslash or a newline in an
    uploaded name would end or split the header, and non-ASCII is not a header's; a `%`
    neither (RFC 6266 D: clients that percent-decode `filename` saved `a%20b` as `a b`). A `/`
    and a `\\` (a Windows client's separator) are made `_` in both: an uploaded `../../x.jsonl`
    named so was saved outside the folder by a client that takes the name as given."""
    segment = filename.replace("/", "_").replace("\\", "_")
    plain = "".join(
        char if char.isascii() and char.isprintable() and char not in '"\\%' else "_"
        for char in segment
    )
    extended = quote(segment, safe="")
    return {"Content-Disposition": f"attachment; filename=\"{plain}\"; filename*=UTF-8''{extended}"}

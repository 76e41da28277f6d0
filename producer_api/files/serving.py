"""The files logic without HTTP: keep a tenant's uploaded batch input, read it back, and serve
an ended batch's output and errors files under the file ids its view gives."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from redis.exceptions import RedisError

from producer_api.auth.principal import ANONYMOUS, Principal
from producer_api.batch_api.progress import BATCH_FILE
from producer_api.batch_api.serving import BatchApiService, BatchNotFound
from producer_api.errors import NO_RETRY, ConveyorError
from producer_api.state import ProducerState
from shared.file_store import FILE_OVERHEAD_BYTES, OverBudget, StoredFile, charged
from shared.job_store import now_ms
from shared.tenant_index import Page

log = logging.getLogger(__name__)
FILE_ID = re.compile(r"file-[0-9a-f]{32}")  # matched whole: `$` lets a trailing newline by
MAX_FILENAME_BYTES = 255  # UTF-8; a name is stored with its file (multipart allows ~4 KB)


# OpenAI's `param` for the file a retrieve, content or delete names: with it a refusal answers
# in OpenAI's shape (`invalid_request_error`), which OpenAI's SDKs read its message from.
FILE_PARAM = "id"


def not_found(file_id: str) -> ConveyorError:
    return ConveyorError(404, "not_found", f"file {file_id} not found", param=FILE_PARAM)


@contextmanager
def naming_the_file(file_id: str) -> Iterator[None]:
    """A batch's refusal of its output or errors file (404 unknown or expired, 409 not ended)
    as the file's, naming it: the batch's own answered in Conveyor's shape on the Files API,
    and an unknown batch's 404 named the batch, not the file the client asked for. An unknown
    batch is told by its error's type (`BatchNotFound`): a match on its message broke silently
    when a message changed."""
    try:
        yield
    except BatchNotFound:
        raise not_found(file_id) from None
    except ConveyorError as exc:
        if exc.param is not None or exc.code is not None:
            raise
        raise ConveyorError(
            exc.status, exc.type, exc.message, exc.headers, exc.details, FILE_PARAM
        ) from None


def file_object(file_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """OpenAI's file object, with the `status` its SDK's type requires (deprecated; an upload
    is whole when answered) and `expires_at` (None for a file stored before it was kept)."""
    expires_at = fields.get("expires_at")
    return {
        "id": file_id,
        "object": "file",
        "bytes": int(fields["bytes"]),
        "created_at": int(fields["created_at"]),
        "expires_at": int(expires_at) if expires_at else None,
        "filename": fields.get("filename", ""),
        "purpose": fields["purpose"],
        "status": "processed",
    }


def check_purpose(purpose: str) -> None:
    """OpenAI's other purposes (`user_data`, `vision`, `fine-tune`, …) serve APIs Conveyor
    lacks: a refusal that names the one sent, since the schema's own said only what it expected."""
    if purpose != "batch":
        message = (
            f"purpose {purpose!r} is not supported: Conveyor keeps files for its Batch API "
            "only (purpose 'batch')"
        )
        raise ConveyorError(422, "invalid_request", message, param="purpose")


def expires_after_s(anchor: str | None, seconds: int | None) -> int | None:
    """OpenAI's `expires_after`: its `anchor` (`created_at`, the one there is) and `seconds`
    together or neither, as OpenAI requires both. Seconds sent alone were taken, so a request
    OpenAI refuses worked here and not there."""
    fields = {"expires_after[anchor]": anchor, "expires_after[seconds]": seconds}
    missing = [name for name, value in fields.items() if value is None]
    if len(missing) == 1:
        message = (
            f"{missing[0]} is required: OpenAI's expires_after is "
            "expires_after[anchor]=created_at and expires_after[seconds] together"
        )
        raise ConveyorError(422, "invalid_request", message, param=missing[0])
    return seconds


def over_budget(refused: OverBudget) -> ConveyorError:
    """A 429 as OpenAI's for a spent quota (`insufficient_quota`), marked not to be retried:
    room comes back only as the tenant deletes files or they expire, not after a backoff."""
    message = (
        f"this tenant's files hold {refused.held} bytes; {refused.size} more (this file's "
        f"content and name, and {FILE_OVERHEAD_BYTES} per file) would pass its budget of "
        f"{refused.budget} (CONVEYOR_MAX_FILE_BYTES_PER_TENANT): delete files "
        "(DELETE /v1/files/{id}) or wait for them to expire"
    )
    return ConveyorError(429, "insufficient_quota", message, NO_RETRY)


class FilesService:
    def __init__(self, state: ProducerState, principal: Principal = ANONYMOUS) -> None:
        self.state = state
        self.store = state.file_store
        self.principal = principal

    async def upload(
        self, filename: str, data: bytes, expires_after_s: int | None = None
    ) -> dict[str, Any]:
        """Keep a batch input file (purpose `batch`) for `expires_after_s` (OpenAI's
        `expires_after`), the result TTL at most, within the tenant's storage budget (its name
        and a per-file overhead counted with its bytes, so tiny files with long names do not
        fill Redis); its lines are checked when a batch names it, as an uploaded batch's
        are."""
        if not data.strip():
            raise ConveyorError(422, "invalid_request", "the file is empty", param="file")
        if len(filename.encode()) > MAX_FILENAME_BYTES:
            message = f"the filename is longer than {MAX_FILENAME_BYTES} bytes (UTF-8)"
            raise ConveyorError(422, "invalid_request", message, param="file")
        file_id = f"file-{uuid.uuid4().hex}"
        created_at = now_ms() // 1000
        expires_at = self.store.expires_at(created_at, expires_after_s)
        fields = {
            "tenant": self.principal.tenant,
            "filename": filename,
            "purpose": "batch",
            "bytes": str(len(data)),
            "created_at": str(created_at),
            "expires_at": str(expires_at),
        }
        budget, size = self.state.settings.max_file_bytes_per_tenant, charged(filename, len(data))
        try:
            await self.store.hold(self.principal.tenant, file_id, size, budget, expires_at)
            await self.store.put(file_id, fields, data, expires_at)
        except OverBudget as refused:
            raise over_budget(refused) from None
        # A cancelled request too: its client never learns the id. A hold whose reply was lost
        # (a timeout) may have run, so it is given back as well.
        except BaseException:
            await self._discard(file_id)
            raise
        return file_object(file_id, fields)

    async def _discard(self, file_id: str) -> None:
        """Give back an upload that failed at or after its hold, best effort (a hold that never
        ran gives back nothing): a Redis that refuses this too keeps the hold until the file
        would have expired."""
        try:
            await self.store.discard(self.principal.tenant, file_id)
        except RedisError as exc:
            log.warning("upload %s failed; its bytes stay held until it expires (%r)", file_id, exc)

    async def get(self, file_id: str) -> dict[str, Any]:
        """An uploaded file's object, or an ended batch's output or errors file's."""
        if named := BATCH_FILE.fullmatch(file_id):
            with naming_the_file(file_id):
                return await self._batches().file_object(*named.groups())
        return await self._uploaded(file_id)

    def _batches(self) -> BatchApiService:
        return BatchApiService(self.state, self.principal)

    async def _uploaded(self, file_id: str) -> dict[str, Any]:
        [found] = await self._owned([file_id]) if FILE_ID.fullmatch(file_id) else [None]
        if found is None:
            raise not_found(file_id)
        return found

    async def _owned(self, file_ids: list[str]) -> list[dict[str, Any] | None]:
        """The tenant's file objects, in one round trip; None for an unknown file or another
        tenant's."""
        tenant = self.principal.tenant
        return [
            file_object(file_id, fields) if fields and fields.get("tenant") == tenant else None
            for file_id, fields in zip(
                file_ids, await self.store.fields_many(file_ids), strict=True
            )
        ]

    async def list(self, after: str | None, limit: int, newest_first: bool) -> Page[dict[str, Any]]:
        """The tenant's uploaded files from the one after `after`: up to `limit`, and whether
        more follow. A file whose key expired leaves the list once passed over."""
        return await self.store.page(self.principal.tenant, after, limit, self._owned, newest_first)

    async def delete(self, file_id: str) -> dict[str, Any]:
        """Forget an uploaded file (a batch made from it keeps its lines). A batch's own output
        and errors files are read from its items, and go with the batch: `deleted: false` once
        it has ended (OpenAI's clients delete them after reading), 409 before, 404 once the
        file expired (as its retrieve and content answer)."""
        if named := BATCH_FILE.fullmatch(file_id):
            with naming_the_file(file_id):
                await self._batches().kept(named[1], named[2], only_named=True)
            return {"id": file_id, "object": "file", "deleted": False}
        if not await self._dropped(file_id):
            raise not_found(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    async def _dropped(self, file_id: str) -> bool:
        """Whether this call dropped the tenant's uploaded file. Found gone, or never the
        tenant's, what the tenant still holds for the id is given back (`FileStore.forget`; none
        for an id it never held): a delete cut short once the file was gone (its transaction
        sent again when its reply was lost, a timeout, a producer that died) gave none back, nor
        did its retry's 404, until the file would have expired."""
        if not FILE_ID.fullmatch(file_id):  # no id of a file (`total` is the budget's own field)
            return False
        [found] = await self._owned([file_id])
        if found is not None and await self.store.delete(file_id):
            return True
        await self.store.forget(self.principal.tenant, file_id)
        return False

    async def data(self, file_id: str) -> bytes:
        """An uploaded file's bytes (a batch's input); 404 for another tenant's."""
        return (await self._stored(file_id)).data

    async def _stored(self, file_id: str) -> StoredFile:
        found = await self.store.data(file_id) if FILE_ID.fullmatch(file_id) else None
        if found is None or found.tenant != self.principal.tenant:
            raise not_found(file_id)
        return found

    async def content(self, file_id: str) -> StoredFile | AsyncIterator[bytes]:
        """An uploaded file with its name, whole (one read of its hash, so its size is known),
        or an ended batch's output or errors file, its lines as they are read (409 before it
        ends)."""
        if named := BATCH_FILE.fullmatch(file_id):
            with naming_the_file(file_id):
                return await self._batches().file(named[1], named[2], only_named=True)
        return await self._stored(file_id)

"""Response bodies of the files resource."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class FileObject(BaseModel):
    """OpenAI's file object; `created_at` and `expires_at` in seconds. An upload's purpose is
    `batch`; an ended batch's output and errors files are `batch_output`."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["processed"] = "processed"


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class FileList(BaseModel):
    """OpenAI's list of files; `after` = `last_id` pages on."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool

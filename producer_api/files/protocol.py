"""Response bodies of the files resource."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class FileObject(BaseModel):
    """OpenAI's file object; `created_at` in seconds."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: Literal["batch"]


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool

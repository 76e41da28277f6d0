"""Files the CLI writes whole or not at all: each is written under a hidden name beside its
own, then renamed over it. Written in place, a write cut short (a full disk, a file size limit,
Ctrl-C) left a truncated file that read as whole, over a good copy of an earlier run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from pathlib import Path


def draft_of(path: Path) -> Path:
    """A hidden name beside `path`, for its content until it is whole."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")


def write_draft(draft: Path, chunks: Iterable[bytes]) -> None:
    """`chunks` written to a new `draft` and on disk (fsync) before it is renamed."""
    with draft.open("xb") as file:
        file.writelines(chunks)
        os.fsync(file.fileno())


def write_whole(path: Path, body: bytes) -> None:
    """`body` as `path`, whole; on failure the draft goes and any earlier `path` stays."""
    draft = draft_of(path)
    try:
        write_draft(draft, [body])
        draft.replace(path)
    finally:
        draft.unlink(missing_ok=True)

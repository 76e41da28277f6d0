"""Files the CLI writes whole or not at all: each is written under a hidden name beside its
own, then renamed over it. Written in place, a write cut short (a full disk, a file size limit,
Ctrl-C) left a truncated file that read as whole, over a good copy of an earlier run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from pathlib import Path


def landing_of(path: Path) -> Path:
    """Where a write to `path` lands: a symlink's final target (a dangling one's too), as a
    write in place went, else `path`. Renamed over, the link itself became a regular file and
    its target kept the old content. A loop of links raises OSError (ELOOP), as opening it did."""
    if not path.is_symlink():
        return path
    try:
        return Path(os.path.realpath(path, strict=True))
    except FileNotFoundError:
        return Path(os.path.realpath(path))


def draft_of(path: Path) -> Path:
    """A hidden name beside `path`, for its content until it is whole."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")


def write_draft(draft: Path, chunks: Iterable[bytes], like: Path | None = None) -> None:
    """`chunks` written to a new `draft` and on disk (fsync) before it is renamed; with the
    mode of `like`, the file it will replace, if there is one, set before a byte is written:
    renamed over, a 0600 file became the umask's default (0644, readable by all)."""
    mode = _mode_of(like)
    with draft.open("xb") as file:
        if mode is not None:
            os.fchmod(file.fileno(), mode)
        file.writelines(chunks)
        os.fsync(file.fileno())


def _mode_of(path: Path | None) -> int | None:
    """The permission bits of the file at `path`, but setuid, setgid and sticky (a write in
    place cleared them); None if there is none."""
    try:
        return path.stat().st_mode & 0o777 if path is not None else None
    except FileNotFoundError:
        return None


def write_whole(path: Path, body: bytes) -> None:
    """`body` as `path` (written through a symlink, keeping an earlier file's mode), whole; on
    failure the draft goes and any earlier `path` stays. A path that is no regular file (a
    pipe, a terminal: `-o /dev/stdout`) is written in place: nothing could be renamed over it,
    and a draft beside it, in /dev or /proc, could not be made."""
    landing = landing_of(path)
    if landing.exists() and not landing.is_file():
        with landing.open("wb") as stream:
            stream.write(body)
        return
    draft = draft_of(landing)
    try:
        write_draft(draft, [body], like=landing)
        draft.replace(landing)
    finally:
        draft.unlink(missing_ok=True)

"""Files the CLI writes whole or not at all (`write_all_whole`, its one owner): each is written
under a hidden name beside its own, then renamed over it. Written in place, a write cut short (a
full disk, a file size limit, Ctrl-C) left a truncated file that read as whole, over a good copy
of an earlier run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
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


class NotWritten(OSError):
    """A file of `write_all_whole` that could not be written: its `path` as the caller named
    it (the OSError itself names its draft)."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(error.errno, error.strerror or str(error))
        self.path = path


def written_in_place(path: Path) -> bool:
    """Whether `path` is no regular file nor folder (a pipe, a terminal, `-o /dev/stdout`),
    looked at through its links, /proc's own included: nothing could be renamed over it, and a
    draft beside it, in /dev or /proc, could not be made. Looked at where `landing_of` leads,
    /dev/stdout on a pipe read `/proc/PID/fd/pipe:[N]`, a path that is not there."""
    return path.exists() and not path.is_file() and not path.is_dir()


def write_whole(path: Path, body: bytes) -> None:
    """`body` as `path`, whole (`write_all_whole`)."""
    write_all_whole([(path, [body])])


def write_all_whole(files: Sequence[tuple[Path, Iterable[bytes]]]) -> None:
    """Each path's chunks as that path (written through a symlink, keeping an earlier file's
    mode), whole: every draft is written before any is renamed, so a failure (`NotWritten`)
    leaves every earlier file as it was, and no draft. A path `written_in_place` is written
    after the drafts, before the renames: a pipe cannot take back what it was given."""
    in_place = [written_in_place(path) for path, _ in files]
    drafts: list[tuple[Path, Path, Path]] = []  # (path, its draft, where it lands)
    try:
        for (path, chunks), placed in zip(files, in_place, strict=True):
            if not placed:
                with _named(path):
                    landing = landing_of(path)
                    drafts.append((path, draft_of(landing), landing))
                    write_draft(drafts[-1][1], chunks, like=landing)
        for (path, chunks), placed in zip(files, in_place, strict=True):
            if placed:
                with _named(path), path.open("wb") as stream:
                    stream.writelines(chunks)
        for path, draft, landing in drafts:  # two paths may land on one file: the last wins
            with _named(path):
                draft.replace(landing)
    finally:
        for _, draft, _ in drafts:
            draft.unlink(missing_ok=True)


@contextmanager
def _named(path: Path) -> Iterator[None]:
    """An OSError raised within as `NotWritten` of `path`."""
    try:
        yield
    except OSError as exc:
        raise NotWritten(path, exc) from exc

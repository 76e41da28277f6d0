"""A UTF-8 byte order mark (Notepad's "UTF-8 with BOM") is the file's, not its first line's:
on a line of its own (the file's first line blank, or the file empty) it was read as a line of
invalid JSON, a failed line in the counts and the errors file, and an empty file saved so made
a `failed` batch where an empty one is refused. Stack-free: the lines as a create reads them."""

from __future__ import annotations

from typing import Any

from producer_api.batch_api import lines
from shared.model_repository import ModelConfig

BOM = b"\xef\xbb\xbf"
CONFIG = ModelConfig(name="identity", kind="batch", backend="identity")
LINE = b'{"custom_id": "a", "body": {"inputs": {}}}'


def _build(model: str, body: Any, names: Any) -> Any:
    return object(), CONFIG, "default"


def _parsed(source: bytes) -> lines.ParsedBatch:
    batch = lines.ParsedBatch("identity", _build, {"/v1/jobs": lines.job_body}, 64, 10, 4096)
    return lines.parse(source, batch)


def test_a_byte_order_mark_is_no_line() -> None:
    for source in (BOM + b"\r\n" + LINE + b"\r\n", BOM + b"\n\n" + LINE):
        parsed = _parsed(source)
        assert parsed.rejected == [], parsed.rejected
        numbered = [(item.line, item.custom_id) for item in parsed.items]
        assert numbered == [(len(source.splitlines()), "a")]
    assert [item.line for item in _parsed(BOM + LINE).items] == [1]
    empty = _parsed(BOM + b"\r\n")
    assert (empty.items, empty.rejected) == ([], [])  # the create refuses it: no lines

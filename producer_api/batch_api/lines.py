"""Reads a batch's JSONL: each line becomes a job ready to enqueue, or a rejection with its line
number and reason, so one bad line never sinks the batch. Runs in a thread (CPU-bound)."""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from producer_api.batch_api.protocol import BatchItemBody, BatchLine
from producer_api.errors import ConveyorError
from producer_api.jobs.protocol import PredictRequest
from producer_api.request_boundary import check_value, parse_json
from shared.codec import RequestEntry
from shared.job_parameters import AS_JOB_FIELDS, FieldNames
from shared.model_repository import ModelConfig, client_named
from shared.problem_list import listed

# a line's job, from its model, its body as the route reads it, and how a refusal names its fields
Build = Callable[[str, PredictRequest, FieldNames], tuple[RequestEntry, ModelConfig, str]]
# How a line's body becomes a job request, by the route the line names: (the model the body
# names, if it does, the request). Raises ValidationError or ConveyorError.
Reader = Callable[[dict[str, Any]], tuple[str | None, PredictRequest, FieldNames]]


def job_body(body: dict[str, Any]) -> tuple[str | None, PredictRequest, FieldNames]:
    """A `/v1/jobs` line's body: a job body whose model may be left to the batch."""
    request = BatchItemBody.model_validate(body)
    return request.model, request, AS_JOB_FIELDS


@dataclass(slots=True)
class Item:
    line: int
    custom_id: str
    entry: RequestEntry
    config: ModelConfig
    variant: str


class LineError(Exception):
    def __init__(self, type_: str, message: str, custom_id: str | None = None) -> None:
        super().__init__(message)
        self.type = type_
        self.message = message
        self.custom_id = custom_id


def rejection(line: int, custom_id: str | None, type_: str, message: str) -> dict[str, Any]:
    """An errors-file line for a line that never became a job."""
    return {
        "custom_id": custom_id,
        "line": line,
        "status": "invalid",
        "error": {"type": type_, "message": message},
    }


def _describe(exc: ValidationError, prefix: str) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(client_named(p) for p in (prefix, *err["loc"]) if p)
        parts.append(f"{where or 'line'}: {err['msg']}")
    return listed(parts)


@dataclass
class ParsedBatch:
    """The batch's model is the one asked for, else the first line's; every line must use it,
    and the route the batch names, else the first valid line's (one model and one endpoint per
    batch, as in OpenAI's Batch API)."""

    model: str | None
    build: Build
    readers: Mapping[str, Reader]
    max_depth: int  # CONVEYOR_MAX_JSON_DEPTH: of a line's body, as of the route's
    max_lines: int
    max_line_bytes: int  # CONVEYOR_MAX_BODY_BYTES: what the route a line names takes of a body
    url: str | None = None
    items: list[Item] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)

    def add(self, number: int, raw: bytes) -> None:
        """A refused line that names a `custom_id` holds it, as an accepted line does, whatever
        it was refused for: one refused for its shape (an unknown field, a method not POST)
        held none, so a later line with that id ran, and the id named both a line of the errors
        file and one of the output (OpenAI's are unique per batch)."""
        try:
            self.items.append(self._item(number, raw))
        except LineError as err:
            if err.custom_id is not None:
                self._seen.add(err.custom_id)
            self.rejected.append(rejection(number, err.custom_id, err.type, err.message))

    def _item(self, number: int, raw: bytes) -> Item:
        line = _line(raw, self.max_depth)
        if line.custom_id in self._seen:
            message = "custom_id already used by an earlier line"
            raise LineError("duplicate_custom_id", message, line.custom_id)
        self._seen.add(line.custom_id)
        if (size := _body_bytes(raw, line, self.max_line_bytes)) > self.max_line_bytes:
            message = (
                f"body is {size} bytes, over CONVEYOR_MAX_BODY_BYTES ({self.max_line_bytes}):"
                " a job's body is held to it here as on the route the line names"
            )
            raise LineError("payload_too_large", message, line.custom_id)
        if self.url is not None and line.url != self.url:
            message = f"line is for {line.url}; this batch is for {self.url}"
            raise LineError("url_mismatch", message, line.custom_id)
        try:
            named, body, names = self.readers[line.url](line.body)
        except ValidationError as exc:
            raise LineError("invalid_request", _describe(exc, "body"), line.custom_id) from None
        except ConveyorError as exc:
            raise LineError(exc.type, exc.message, line.custom_id) from None
        model = named or self.model
        if model is None:
            message = "no model: name it on the batch or in the line's body"
            raise LineError("invalid_request", message, line.custom_id)
        if self.model is not None and model != self.model:
            message = f"line is for model {model!r}; this batch is for {self.model!r}"
            raise LineError("model_mismatch", message, line.custom_id)
        try:
            entry, config, variant = self.build(model, body, names)
        except ConveyorError as exc:
            raise LineError(exc.type, exc.message, line.custom_id) from None
        self.model, self.url = model, line.url
        return Item(number, line.custom_id, entry, config, variant)


def _body_bytes(raw: bytes, line: BatchLine, limit: int) -> int:
    """The size of a line's body, as OpenAI's Batch API holds each request's body to its
    endpoint's limits: the line counted, its `custom_id`, `method` and `url` refused a body the
    route takes. A line within `limit` is not measured again (its body is no larger)."""
    return len(raw) if len(raw) <= limit else len(orjson.dumps(line.body))


def _line(raw: bytes, max_depth: int) -> BatchLine:
    """A line's body is held to what the request boundary asks of a JSON body, its depth
    counted from the body (the line's own object is one level more): a body the route takes
    was refused as a line. A line's other fields are strings (`BatchLine` refuses the rest)."""
    try:
        obj = parse_json(raw, max_depth + 1)
    except ValueError as exc:  # UnstorableJson, JSONDecodeError, UnicodeDecodeError
        message = f"not acceptable JSON: {exc}"
        raise LineError("invalid_json", message, _named_despite(raw)) from None
    try:
        return BatchLine.model_validate(obj)
    except ValidationError as exc:
        raise LineError("invalid_request", _describe(exc, ""), _custom_id(obj)) from None


def _custom_id(obj: Any) -> str | None:
    """The `custom_id` a line's JSON names, when it is a string."""
    custom_id = obj.get("custom_id") if isinstance(obj, dict) else None
    return custom_id if isinstance(custom_id, str) else None


def _named_despite(raw: bytes) -> str | None:
    """The `custom_id` of a line refused as JSON that still parses (a value no job may hold: an
    integer past 64 bits, a number past a float's, a lone surrogate, a body nested too deep,
    Python's `NaN`), read only for such a refused line: its errors line named no id, so a
    client could not tell which request failed, and a later line with the id ran. None for
    text that does not parse, or an id the errors file could not hold (a lone surrogate)."""
    try:
        custom_id = _custom_id(json.loads(raw))
        if custom_id is not None:
            check_value(custom_id, 1)
    except (ValueError, RecursionError):  # JSONDecodeError, UnstorableJson, too deep to read
        return None
    return custom_id


def parse(source: bytes, parsed: ParsedBatch) -> ParsedBatch:
    """Line numbers count every physical line (1-based); blank lines are skipped. More lines
    than `max_lines` is a 413 before any is read: each would be stored, if only as a rejection.
    A UTF-8 byte order mark is the file's, not its first line's: left on a line of its own (the
    file's first line blank, or the file empty) it made a line of invalid JSON."""
    physical = source.removeprefix(codecs.BOM_UTF8).splitlines()
    numbered = [(n, raw) for n, raw in enumerate(physical, start=1) if raw.strip()]
    if len(numbered) > parsed.max_lines:
        message = (
            f"the batch has {len(numbered)} lines, more than CONVEYOR_MAX_BATCH_LINES "
            f"({parsed.max_lines}); split it"
        )
        raise ConveyorError(413, "payload_too_large", message)
    for number, raw in numbered:
        parsed.add(number, raw)
    return parsed

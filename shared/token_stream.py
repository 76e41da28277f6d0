"""The layout of an LLM job's token stream (`cv:tok:{id}`), shared by the worker that appends to
it and the producer routes that stream it (SSE, OpenAI; `producer_api/token_hub.py` follows
it): entry ids are the SSE event ids, so a reader that resumes after an id misses nothing and
repeats nothing. Each entry also carries `a` and `n`, its run of the job and its number in that
run, by which a resent append is appended once (shared/token_scripts.py); readers ignore them."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.codec import as_text, dumps, loads, stream_id
from shared.job_store import JobRecord
from shared.settings import get_settings

# token: new text of one engine step; final: the job ended (status, finish reason, usage);
# restart: a redelivered job starts over (its worker died mid-generation): drop the text so far.
EventKind = Literal["token", "final", "restart"]
READ_COUNT = 512


@dataclass(slots=True)
class TokenEvent:
    kind: EventKind
    text: str = ""
    tokens: int = 0
    status: str = ""
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    error: dict[str, str] | None = None
    id: str = ""

    @property
    def final(self) -> bool:
        return self.kind == "final"

    def encode(self) -> dict[str, str | int]:
        """Entry fields: only what the kind needs, so a token entry stays two short fields
        (besides the run and number APPEND adds). The count goes as Python's int: an engine's
        may be any integer (numpy's), which redis-py refuses, failing every job's tick."""
        if self.kind == "token":
            return {"kind": "token", "text": self.text, "tokens": operator.index(self.tokens)}
        if self.kind == "restart":
            return {"kind": "restart"}
        fields: dict[str, str | int] = {"kind": "final", "status": self.status}
        if self.finish_reason:
            fields["finish_reason"] = self.finish_reason
        if self.usage:
            fields["usage"] = dumps(self.usage).decode()
        if self.error:
            fields["error"] = dumps(self.error).decode()
        return fields

    @classmethod
    def decode(cls, entry_id: bytes | str, raw: Mapping[bytes, bytes]) -> TokenEvent:
        get = {as_text(k): as_text(v) for k, v in raw.items()}.get
        kind: Any = get("kind", "token")
        return cls(
            kind=kind,
            text=get("text", ""),
            tokens=int(get("tokens", "0")),
            status=get("status", ""),
            finish_reason=get("finish_reason"),
            usage=loads(usage) if (usage := get("usage")) else {},
            error=loads(error) if (error := get("error")) else None,
            id=as_text(entry_id),
        )

    def data(self) -> dict[str, Any]:
        """The event's public payload (SSE `data`)."""
        if self.kind == "token":
            return {"text": self.text, "tokens": self.tokens}
        if self.kind == "restart":
            return {}
        data: dict[str, Any] = {"status": self.status, "finish_reason": self.finish_reason}
        if self.usage:
            data["usage"] = self.usage
        if self.error:
            data["error"] = self.error
        return data


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def confirms(record: JobRecord | None, last: TokenEvent) -> bool:
    """Whether the stream's last entry `last` is its job's last word: a final the job's hash
    does not contradict (one whose run died before FINISH is not; none without a hash)."""
    return last.final and (record is None or last.status == record.status)


def final_id(record: JobRecord, last: TokenEvent | None) -> str:
    """The id of the final event that ends a stream of the ended job `record` whose last entry
    is `last`: that entry's own, or the made one's (`final_from_job`)."""
    if last is not None and confirms(record, last):
        return last.id
    return made_final_id(last.id if last else None)


def made_final_id(last_id: str | None) -> str:
    """The id of a final made from the job: the one after the stream's last entry (0-1 for
    none), so that a resume after it is told nothing follows. Without an id, an EventSource
    reconnected after it for ever, sent the same final each time."""
    if last_id is None:
        return "0-1"
    ms, seq = stream_id(last_id)
    return f"{ms}-{seq + 1}" if seq < 2**64 - 1 else f"{ms + 1}-0"


def final_from_job(record: JobRecord, last_id: str | None) -> TokenEvent:
    """The final event of a job that ended without one in its stream (cancelled or expired
    while queued, dead-lettered, failed before its first token, stream expired); `last_id`
    is the stream's last entry (None: it holds none)."""
    view = record.view()
    raw_outputs = view.get("outputs")
    outputs: dict[str, Any] = raw_outputs if isinstance(raw_outputs, dict) else {}
    usage = outputs.get("usage") or (
        usage_of(view["prompt_tokens"], view["completion_tokens"])
        if "prompt_tokens" in view and "completion_tokens" in view
        else {}
    )
    return TokenEvent(
        kind="final",
        status=str(view["status"]),
        finish_reason=outputs.get("finish_reason"),
        usage=usage,
        error=view.get("error"),
        id=made_final_id(last_id),
    )


def ended_stream_ttl_s(result_ttl_s: int) -> int:
    """How long a job's token stream lives once its job ended (a final written, or the job
    dead-lettered): CONVEYOR_TOKEN_STREAM_TTL_S, never longer than the result it streamed."""
    return min(result_ttl_s, get_settings().token_stream_ttl_s)

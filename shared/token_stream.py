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
from shared.token_scripts import FINAL_EVENT

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
    # made from the job's record, not read from its stream (never encoded): the stream was gone
    retold: bool = False

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


def appended_final_id(record: JobRecord) -> str | None:
    """The id of the final its worker appended to the ended job `record`'s stream, as APPEND
    keeps it in the hash: it tells that final once the stream is gone (expired), when its id
    reads like a token's. None for a job whose stream got no final (ended while queued,
    dead-lettered) or whose record an older worker wrote."""
    return record.fields.get(FINAL_EVENT)


def made_final_id(last_id: str | None) -> str:
    """The id of a final made from the job: the one after the stream's last entry (0-1 for
    none), so that a resume after it is told nothing follows. Without an id, an EventSource
    reconnected after it for ever, sent the same final each time."""
    if last_id is None:
        return "0-1"
    ms, seq = stream_id(last_id)
    return f"{ms}-{seq + 1}" if seq < 2**64 - 1 else f"{ms + 1}-0"


def _outputs(view: dict[str, Any]) -> dict[str, Any]:
    outputs = view.get("outputs")
    return outputs if isinstance(outputs, dict) else {}


def _usage(view: dict[str, Any]) -> dict[str, int]:
    usage: dict[str, int] = _outputs(view).get("usage") or (
        usage_of(view["prompt_tokens"], view["completion_tokens"])
        if "prompt_tokens" in view and "completion_tokens" in view
        else {}
    )
    return usage


def final_from_job(record: JobRecord, last_id: str | None) -> TokenEvent:
    """The final event of a job that ended without one in its stream (cancelled or expired
    while queued, dead-lettered, failed before its first token, stream expired); `last_id`
    is the stream's last entry (None: it holds none)."""
    view = record.view()
    return TokenEvent(
        kind="final",
        status=str(view["status"]),
        finish_reason=_outputs(view).get("finish_reason"),
        usage=_usage(view),
        error=view.get("error"),
        id=made_final_id(last_id),
    )


def retold(record: JobRecord) -> list[TokenEvent]:
    """What a reader that took part of a stream since gone (expired between its pages, or
    before its resume) gets ahead of the job's final: a `restart`, dropping its partial text,
    then the whole text of the job's result as one token event (its tokens: the usage's
    `completion_tokens`, as a run's add up to). Nothing for a job whose result holds no text:
    its final's status says it has none. Neither has an id: a resume after them tells all
    again, since the stream is gone."""
    view = record.view()
    text = _outputs(view).get("text")
    if not isinstance(text, str):
        return []
    tokens = _usage(view).get("completion_tokens", 0)
    whole = TokenEvent("token", text=text, tokens=tokens, retold=True)
    return [TokenEvent("restart", retold=True), whole]


def ended_stream_ttl_s(result_ttl_s: int) -> int:
    """How long a job's token stream lives once its job ended (a final written, or the job
    dead-lettered): CONVEYOR_TOKEN_STREAM_TTL_S, never longer than the result it streamed."""
    return min(result_ttl_s, get_settings().token_stream_ttl_s)

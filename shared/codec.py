"""One codec for everything that crosses Redis: JSON via orjson (numpy arrays included), and the
flat field layout of a request entry in a partition stream."""

from __future__ import annotations

import math
import struct
from base64 import b64decode
from dataclasses import dataclass
from typing import Any

import orjson

_ID_PART_MAX = 2**64 - 1  # each half of a stream entry id is an unsigned 64-bit integer

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=_OPTIONS, default=_array_as_written)


def _array_as_written(value: Any) -> Any:
    """A numpy array orjson's own support refuses, as it can write it: one not C-contiguous (a
    transposed row, a slice: an engine's `scores.T[i]`) as a contiguous copy; a contiguous one
    (0-d, a torch scalar's `.numpy()`, or of a type orjson writes no numbers for: objects,
    strings such as a classifier's `labels[scores.argmax(1)]`) as Python values, a type JSON has
    none for (complex) then refused by name. Each failed its job `InvalidOutput`; one of strings
    or complex numbers, given back as it came, failed it as "default serializer exceeds
    recursion limit". Anything else is refused as before."""
    import numpy as np  # not at the top: the CLI and SDK read JSON here and never meet an array

    if not isinstance(value, np.ndarray):
        raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")
    if value.flags.c_contiguous:
        return value.tolist()
    return np.ascontiguousarray(value)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


# A worker's reply carries a job's outputs as the JSON text it wrote them in, inside a JSON
# string: the producer splices that text into its answer instead of parsing it into objects and
# writing them out again (a GPU micro-batch's embeddings are megabytes of numbers).
OUTPUTS_TEXT = "outputs_json"


def as_written(text: str | bytes) -> orjson.Fragment:
    """JSON text a worker wrote, to be written into an answer as it is, not parsed and
    written again: every `dumps` here takes it in place of the value it stands for."""
    return orjson.Fragment(text)


def as_objects(value: Any) -> Any:
    """A view's outputs as objects, whether parsed already or still as written (`as_written`)."""
    return loads(dumps(value)) if isinstance(value, orjson.Fragment) else value


def float32_values(packed: str) -> list[float]:
    """A vector sent as `encoding_format: base64` (OpenAI's embeddings format): base64 of its
    little-endian float32 values, as numbers again."""
    raw = b64decode(packed)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def spliced_outputs(view: dict[str, Any]) -> dict[str, Any]:
    """A reply's view with its outputs ready to be written as they came (`as_written`)."""
    if (text := view.pop(OUTPUTS_TEXT, None)) is not None:
        view["outputs"] = as_written(text)
    return view


# Set on an entry a fair lane's round robin moved into the stream from its held jobs (never on
# one enqueued straight in): a worker that reads one knows more may be held (lane_scheduler.py).
MOVED_FIELD = "moved"


@dataclass(slots=True)
class RequestEntry:
    """What a stream entry carries (docs/architecture.md): enough for a worker to run, expire
    and reply."""

    job_id: str
    payload: dict[str, Any]
    enqueued_ms: float  # to the µs (shared/job_store.stamp_ms)
    deadline_ms: int = 0
    tenant: str = "default"
    reply: str = ""
    traceparent: str = ""
    # The client's W3C tracestate, as the producer's span holds it: field `ts`, written only
    # when set, so an entry without one is no longer. An older worker skips it (`decode` reads
    # only the fields it names), a newer one reads an older producer's entry as without one.
    # So too `tp` and `deadline`, written only when set: every release's `decode` reads a
    # missing one as none, and each cost every untraced job without a deadline four arguments
    # through ENQUEUE and its stream entry and AOF 21 bytes.
    tracestate: str = ""
    # The API key's in-flight set holding the job (shared/rate_limit.py), freed by whoever
    # ends the job: it lives in the key's slot, so the ender frees it beside its script.
    inflight: str = ""
    # A Batch API item's batch: its completion window (carried as the deadline) bounds its
    # wait, not the queue's max_queue_time_s. `batch_until`: that window's end (ms), which tells
    # an item the window expired from one whose line's own earlier deadline did.
    batch: str = ""
    batch_until: int = 0
    # A dead letter's replay: the job it runs again, named in its view and webhook events, so
    # that a receiver can tell an event for an id it never submitted.
    replay_of: str = ""

    def encode(self) -> dict[str, bytes | str | float]:
        fields: dict[str, bytes | str | float] = {
            "id": self.job_id,
            "payload": dumps(self.payload),
            "enq": self.enqueued_ms,
            "tenant": self.tenant,
            "reply": self.reply,
        }
        if self.deadline_ms:
            fields["deadline"] = self.deadline_ms
        if self.traceparent:
            fields["tp"] = self.traceparent
        if self.tracestate:
            fields["ts"] = self.tracestate
        if self.inflight:
            fields["inflight"] = self.inflight
        if self.batch:
            fields["batch"] = self.batch
            fields["batch_until"] = self.batch_until
        if self.replay_of:
            fields["replay_of"] = self.replay_of
        return fields

    @classmethod
    def decode(cls, fields: dict[bytes, bytes]) -> RequestEntry:
        """The entry a stream holds; KeyError or ValueError for one no producer writes (the
        worker acknowledges it unrun): a payload that is JSON but not an object, or a
        non-finite `enq`, decoded, then crashed the loop's micro-batch at each delivery."""
        return cls(
            job_id=fields[b"id"].decode(),
            payload=_json_object(fields[b"payload"]),
            enqueued_ms=_finite(fields[b"enq"]),
            deadline_ms=int(fields.get(b"deadline", b"0")),
            tenant=fields.get(b"tenant", b"default").decode(),
            reply=fields.get(b"reply", b"").decode(),
            traceparent=fields.get(b"tp", b"").decode(),
            tracestate=fields.get(b"ts", b"").decode(),
            inflight=fields.get(b"inflight", b"").decode(),
            batch=fields.get(b"batch", b"").decode(),
            batch_until=int(fields.get(b"batch_until", b"0")),
            replay_of=fields.get(b"replay_of", b"").decode(),
        )

    @property
    def window_ended(self) -> bool:
        """Whether this Batch API item's deadline is its batch's window end, not its line's own
        earlier one (an older producer's item, naming no window end, is taken as its own)."""
        return bool(self.batch_until) and self.deadline_ms >= self.batch_until

    @classmethod
    def named(cls, fields: dict[bytes, bytes], now_ms: float) -> RequestEntry | None:
        """What an entry `decode` refused still says of its job, its text fields as they read
        (id, reply channel, tenant, in-flight set): enough to fail the job, whose client
        otherwise polled it queued until its TTL. Its payload is empty, its enqueue stamp
        `now_ms`: its `enq` is as untrusted as the rest (one of 1 told the client its job was
        created in 1970); None for an entry that names no job."""

        def text(name: bytes) -> str:
            return fields.get(name, b"").decode(errors="replace")

        if not (job_id := text(b"id")):
            return None
        return cls(
            job_id,
            {},
            now_ms,
            tenant=text(b"tenant") or "default",
            reply=text(b"reply"),
            traceparent=text(b"tp"),
            tracestate=text(b"ts"),
            inflight=text(b"inflight"),
            replay_of=text(b"replay_of"),
        )


def _json_object(data: bytes) -> dict[str, Any]:
    value = loads(data)
    if not isinstance(value, dict):
        raise ValueError(f"a payload must be a JSON object, not {type(value).__name__}")
    return value


def _finite(data: bytes) -> float:
    value = float(data)
    if not math.isfinite(value):
        raise ValueError(f"a timestamp must be finite, not {value}")
    return value


def as_text(value: bytes | str) -> str:
    """A Redis reply value as text (clients here do not decode responses)."""
    return value.decode() if isinstance(value, bytes) else value


def stream_id(entry_id: bytes | str) -> tuple[int, int]:
    """A stream entry id as (milliseconds, sequence): it orders as the stream does."""
    ms, _, seq = as_text(entry_id).partition("-")
    return int(ms), int(seq or 0)


def is_stream_id(text: str) -> bool:
    """True for an entry id Redis accepts as a read cursor (`<ms>-<seq>`, both within 64 bits):
    checked before a client's id reaches a read that other clients share."""
    ms, dash, seq = text.partition("-")
    return (
        dash == "-"
        and len(text) <= 41
        and ms.isascii()
        and ms.isdigit()
        and seq.isascii()
        and seq.isdigit()
        and int(ms) <= _ID_PART_MAX
        and int(seq) <= _ID_PART_MAX
    )

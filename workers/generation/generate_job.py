"""One generate job while the engine runs it: the request the engine sees (built from the job's
payload), the text and token timings as chunks arrive, and what it ends with: the token
stream's final event and the job-hash fields (outputs, TTFT, TPOT, token counts)."""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.codec import dumps, loads
from shared.job_scripts import OUTPUTS_SO_FAR
from shared.job_states import JobStatus
from shared.job_store import now_ms
from shared.model_repository import unnamed_max_tokens
from shared.token_stream import TokenEvent, usage_of
from workers.engines.base import GenerateRequest, TokenChunk
from workers.partition.finish import Finish
from workers.partition.stream_reader import Delivery
from workers.partition.token_writer import TokenAppend


def _boolean(value: Any) -> bool:
    """A JSON boolean as it is: `bool("false")` would be True."""
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value


# The sampling parameters a request takes as they are, each with the type it holds it as
# (max_tokens and stop have their own defaults and shapes).
CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    "seed": int,
    "top_k": int,
    "min_tokens": int,
    "temperature": float,
    "top_p": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "min_p": float,
    "repetition_penalty": float,
    "ignore_eos": _boolean,
}
# Every parameter the request has a field for; the rest go to its `custom`.
MAPPED = frozenset({*CONVERSIONS, "max_tokens", "stop"})


def generate_request(
    job_id: str, payload: dict[str, Any], defaults: dict[str, Any]
) -> GenerateRequest:
    """The engine request of a job; a malformed parameter raises (TypeError or ValueError) and
    fails that job alone. `max_tokens` defaults to the model's `default_max_tokens`."""
    inputs = payload.get("inputs") or {}
    parameters = payload.get("parameters") or {}
    stop = parameters.get("stop") or []
    request = GenerateRequest(
        request_id=job_id,
        prompt=inputs.get("prompt"),
        messages=inputs.get("messages"),
        max_tokens=int(parameters.get("max_tokens") or unnamed_max_tokens(defaults)),
        stop=[stop] if isinstance(stop, str) else [str(s) for s in stop],
    )
    for name, convert in CONVERSIONS.items():
        if parameters.get(name) is not None:
            setattr(request, name, convert(parameters[name]))
    request.custom = {k: v for k, v in parameters.items() if k not in MAPPED}
    return request


class InvalidChunk(TypeError):
    """An engine's stream yielded what no token stream can carry."""


def checked(chunk: object) -> TokenChunk:
    """The engine's chunk, if a token stream can carry it: text a string UTF-8 can hold, counts
    integers, a finish reason such a string or none. A bad one used to stop the loop that writes
    every job's tokens (the worker's consumer with it); now it fails its own job."""
    if not isinstance(chunk, TokenChunk):
        raise InvalidChunk(f"the engine yielded {type(chunk).__name__}, not a TokenChunk")
    try:
        for count in (chunk.token_count, chunk.prompt_tokens, chunk.completion_tokens):
            operator.index(count)
    except TypeError:
        raise InvalidChunk(f"the engine yielded counts that are not integers: {chunk!r}") from None
    if not isinstance(chunk.text, str) or not isinstance(chunk.finish_reason, str | None):
        raise InvalidChunk(
            f"the engine yielded text or a finish reason that is no string: {chunk!r}"
        )
    try:  # a lone surrogate (a stray byte decoded with surrogateescape) failed the tick's write
        f"{chunk.text}{chunk.finish_reason or ''}".encode()
    except UnicodeEncodeError:
        raise InvalidChunk(f"the engine yielded text UTF-8 cannot hold: {chunk!r}") from None
    return chunk


def engine_failure(exc: Exception) -> dict[str, str]:
    """A job's error for the exception the engine raised for it, its message as UTF-8 can hold
    it: a lone surrogate in it (a stray byte decoded with surrogateescape) failed the JSON of
    the job's final event, and that stopped the loop that writes every job's tokens."""
    message = str(exc) or repr(exc)
    return {
        "type": type(exc).__name__,
        "message": message.encode(errors="backslashreplace").decode(),
    }


@dataclass(slots=True)
class RunningJob:
    """A job inside the engine. `ended_as` is a terminal status someone else gave it (the API
    cancelled it): the loop aborted it. `abandoned` means aborted for shutdown, or lost with a
    dead engine: it is left unacknowledged so another worker runs it again."""

    delivery: Delivery
    stream: str
    request: GenerateRequest
    redelivered: bool
    task: asyncio.Task[None] | None = None
    text: list[str] = field(default_factory=list)
    first_token_ms: int = 0
    first_tokens: int = 0  # the tokens of the first chunk that had any
    last_token_ms: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    error: dict[str, str] | None = None
    ended_as: str | None = None
    abandoned: bool = False
    peak_running: int = 0
    streamed: bool = False
    attempt: str = field(default_factory=lambda: uuid.uuid4().hex[:8])  # this run's, per stream
    appended: int = 0  # token-stream events of this run handed to the writer

    @property
    def job_id(self) -> str:
        return self.request.request_id

    def take(self, chunk: TokenChunk, at_ms: int, engine_running: int) -> list[TokenEvent]:
        """Account for one chunk; returns the token-stream events it becomes (a redelivered
        job's first write starts with `restart`, so readers drop the dead attempt's text). A
        step that decoded no text still counts its tokens in a token event (empty text): the
        last step often has none (end of sequence, or text a stop string cut), and readers'
        sums of `tokens` fell short of the usage."""
        events = self._opening()
        self.peak_running = max(self.peak_running, engine_running)
        if chunk.token_count:
            if not self.first_token_ms:
                self.first_token_ms, self.first_tokens = at_ms, chunk.token_count
            self.last_token_ms = at_ms
        self.prompt_tokens = chunk.prompt_tokens or self.prompt_tokens
        self.completion_tokens = chunk.completion_tokens or self.completion_tokens
        self.finish_reason = chunk.finish_reason or self.finish_reason
        if chunk.text or chunk.token_count:
            self.text.append(chunk.text)
            events.append(TokenEvent("token", text=chunk.text, tokens=chunk.token_count))
        return events

    def append(self, events: list[TokenEvent]) -> TokenAppend:
        """`events` to append to the job's token stream, numbered on from this run's last; the
        run's first append and its final one set the stream's TTL."""
        expire = self.appended == 0 or any(event.final for event in events)
        append = TokenAppend(self.job_id, self.attempt, self.appended + 1, events, expire)
        self.appended += len(events)
        return append

    @property
    def let_go(self) -> bool:
        """Aborted by the loop (the API ended it, or it was given up): what the engine yields
        for it from then on is the abort's doing."""
        return self.ended_as is not None or self.abandoned

    @property
    def status(self) -> JobStatus:
        if self.ended_as is not None:
            return JobStatus(self.ended_as)
        if self.error is not None or self.finish_reason not in ("stop", "length"):
            return JobStatus.FAILED
        return JobStatus.SUCCEEDED

    @property
    def failure(self) -> dict[str, str]:
        return self.error or {
            "type": "EngineAborted",
            "message": f"the engine ended the generation ({self.finish_reason or 'no reason'})",
        }

    @property
    def ending(self) -> str | None:
        """Its finish reason as told: `abort` for a generation aborted because the API ended it
        (a cancel), as vLLM reports an aborted request."""
        return "abort" if self.ended_as else self.finish_reason

    def _opening(self) -> list[TokenEvent]:
        """`restart` before a redelivered run's first event, whether a chunk's or its final (a
        run that ended before any chunk: its final alone left the dead run's text standing)."""
        events = [TokenEvent("restart")] if self.redelivered and not self.streamed else []
        self.streamed = True
        return events

    def closing_events(self) -> list[TokenEvent]:
        """The events its end appends before FINISH: a `restart` its run still owes. Its final
        follows FINISH (`GenerateLoop._write_finals`), to say what the record ended as."""
        return self._opening()

    def final_event(self) -> TokenEvent:
        status = self.status
        return TokenEvent(
            "final",
            status=status.value,
            finish_reason=self.ending,
            usage=usage_of(self.prompt_tokens, self.completion_tokens),
            error=self.failure if status == JobStatus.FAILED else None,
        )

    def settle(self, finish: Finish) -> None:
        """End as FINISH left the record, for the final to say the same: as the API ended it
        (a cancel after the tick's status read, `Finish.met`: `abort`, as FINISH wrote the
        record's outputs), or failed with the error FINISH wrote for a result too large to
        store, which APPEND otherwise turned into a `failed` final with no error."""
        if finish.met:
            self.ended_as = finish.met
        elif finish.status == JobStatus.FAILED and self.status != JobStatus.FAILED:
            self.error = loads(finish.fields["error"])

    @property
    def ttft_ms(self) -> float | None:
        """Submit to first token: what the client waits, queue wait included. Never below 0: the
        first token is stamped on the worker's clock, the submit on the producer's, and a
        producer's clock ahead took from the TTFT histogram's `_sum` (`rate()` reads a reset)."""
        entry = self.delivery.entry
        if not self.first_token_ms or entry is None:
            return None
        return round(max(0, self.first_token_ms - entry.enqueued_ms), 3)

    @property
    def tpot_ms(self) -> float | None:
        """First chunk to last, per token after the first chunk's. A first chunk may carry
        several: the tokens of steps whose text vLLM held back (a possible stop string, an
        emoji's first bytes). Divided by all tokens but one, a generation whose text was held
        back to its end (a stop string longer than it) read 0.0 ms per token."""
        after_first = self.completion_tokens - self.first_tokens
        if not self.first_token_ms or after_first < 1:
            return None
        return round((self.last_token_ms - self.first_token_ms) / after_first, 3)

    def fields(self) -> dict[str, str]:
        """The job-hash fields of the result (outputs or error, timings, token counts). A
        failed one brings its text so far too (OUTPUTS_SO_FAR), which FINISH writes only to
        the record of a cancel it meets: the final then says `cancelled` and `abort`, and the
        record keeps the text its client read, as a generation cancelled while it runs does."""
        fields = {
            "prompt_tokens": str(self.prompt_tokens),
            "completion_tokens": str(self.completion_tokens),
            "batch_size": str(self.peak_running),
            "engine_ms": str(now_ms() - self.delivery.claimed_ms),
        }
        if (ttft := self.ttft_ms) is not None:
            fields["ttft_ms"] = str(ttft)
        if (tpot := self.tpot_ms) is not None:
            fields["tpot_ms"] = str(tpot)
        outputs = {
            "text": "".join(self.text),
            "finish_reason": self.ending,
            "usage": usage_of(self.prompt_tokens, self.completion_tokens),
        }
        if self.status == JobStatus.FAILED:
            fields["error"] = dumps(self.failure).decode()
            fields[OUTPUTS_SO_FAR] = dumps(outputs).decode()
        else:
            fields["outputs"] = dumps(outputs).decode()
        return fields

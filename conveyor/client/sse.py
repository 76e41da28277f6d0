"""Server-sent events over as many connections as it takes: a decoder for the wire format
(`id:` / `event:` / `data:` / `retry:` lines, a blank line ends an event) and the state that
resumes a dropped stream with `Last-Event-ID`, so every event arrives exactly once."""

from __future__ import annotations

import codecs
import random
import re
import time
from dataclasses import dataclass, field, replace

import httpx

from conveyor.client.calls import Call
from conveyor.client.errors import APIError, InvalidArgument, StreamError, api_error
from conveyor.client.retries import NEVER_SENT, REFUSED, UNAVAILABLE, retry_after_s
from conveyor.client.types import Event

# Event types after which the server has nothing more to send (docs/architecture.md; progress,
# tokens, final; a cancelled job's stream ends with a cancellation event). `data: [DONE]` ends an
# OpenAI-style stream.
TERMINAL_EVENTS = frozenset({"final", "done", "end", "cancelled", "failed", "expired"})
_LINE_END = re.compile(r"\r\n|\r|\n")
# How long resumes may fail with no event received before StreamError (a connection open,
# however quiet, does not count): longer than a Redis failover or a producer's restart, which the
# server's `retry:` (1 s) alone outlasted in 9 s.
RECONNECT_FOR_S = 120.0
BACKOFF_CAP_S = 10.0  # the longest pause between two resumes (but a longer Retry-After)
_BACKOFF_DOUBLINGS = 6  # 0.25 s * 2**6 is past the cap; 2**1024 failures overflowed a float


def _utf8() -> codecs.IncrementalDecoder:
    """The spec's decoding of a stream's bytes: UTF-8, a leading BOM dropped, bytes that are
    no UTF-8 read as U+FFFD (as httpx's `iter_text` read them), a character cut between two
    pieces kept whole."""
    return codecs.getincrementaldecoder("utf-8-sig")(errors="replace")


@dataclass
class LineSplitter:
    """An event stream's lines, decoded as the spec decodes them (UTF-8 whatever charset the
    Content-Type names, one leading BOM dropped: read by its label, a relabelled stream's text
    was mangled, and a BOM made the first field's name `\\ufeffid`) and ended as it ends them
    (CRLF, CR or LF) and nowhere else: httpx's `iter_lines` also breaks at U+2028, U+2029,
    U+0085 and the like, which JSON carries raw inside strings, and so cut such an event's data
    in two."""

    _pending: list[str] = field(default_factory=list)  # the line begun, in pieces
    _after_cr: bool = False  # the last text ended with CR: an LF that opens the next is its CRLF
    _decoder: codecs.IncrementalDecoder = field(default_factory=_utf8)

    def feed(self, data: bytes) -> list[str]:
        """The lines `data` ends. A line's pieces are joined once, when it ends: a long event
        (a final event's megabytes of outputs) is not copied again for every piece."""
        text = self._decoder.decode(data)
        if not text:
            return []
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        self._after_cr = text.endswith("\r")
        if not _LINE_END.search(text):
            self._pending.append(text)
            return []
        *lines, rest = _LINE_END.split("".join(self._pending) + text)
        self._pending = [rest]
        return lines


@dataclass
class SSEDecoder:
    """The WHATWG event-stream parsing rules, fed one line at a time. An `id:` counts only
    once its event is complete, so a connection cut mid-event resumes before that event."""

    last_id: str | None = None
    retry_ms: int | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def __post_init__(self) -> None:
        self._id = self.last_id

    def feed(self, line: str) -> Event | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: keep-alive ping
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():  # `²` is a digit too
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> Event | None:
        self.last_id = self._id
        event, data = self._event or "message", self._data
        self._event, self._data = "", []
        if not data:
            return None
        return Event(id=self.last_id, event=event, data="\n".join(data))


@dataclass
class EventStream:
    """One logical stream. It ends on a terminal event, on 204 (the spec's "stop"), or when a
    resume twice in a row brings nothing new; a dropped connection is resumed after an
    exponential backoff (never sooner than the server's `retry:`, capped at `reconnect_for_s`),
    until no event came for `reconnect_for_s` seconds of failed resumes: from each drop to the
    next connection opened, so a quiet job's stream (keep-alive pings for minutes) is not ended
    by its second drop, and a server that accepts each resume then drops it at once still runs
    the time out. A stream that is not `resumable` (a chat completion) ends with its
    connection."""

    call: Call
    resumable: bool = True
    reconnect_for_s: float = RECONNECT_FOR_S
    done: bool = False
    _decoder: SSEDecoder = field(default_factory=SSEDecoder)
    _lines: LineSplitter = field(default_factory=LineSplitter)
    _failures: int = 0  # drops since the last event: an open connection does not reset the backoff
    _failed_s: float = 0.0  # seconds spent failing since the last event, before `_failing_since`
    _failing_since: float | None = None  # monotonic: the drop not yet followed by an open
    _empty_closes: int = 0
    _received: int = 0
    _opened: bool = False  # a response was served (a stream that is not resumable ends with it)
    # The last served response's headers: its X-Request-ID goes with an error its events raise.
    headers: httpx.Headers = field(default_factory=httpx.Headers)

    def __post_init__(self) -> None:
        if not self.reconnect_for_s >= 0:  # NaN: resumed forever, unnoticed
            message = f"reconnect_for_s {self.reconnect_for_s!r}: seconds, 0 or more"
            raise InvalidArgument(message)
        self._decoder = SSEDecoder(last_id=self.call.headers.get("Last-Event-ID"))

    @property
    def last_id(self) -> str | None:
        return self._decoder.last_id

    def next_call(self) -> Call:
        """The next request: resumed after the last id received, or from the start where the
        server's empty `id:` reset it (an empty `Last-Event-ID` is no id: the producer's 422)."""
        headers = {**self.call.headers, "Accept": "text/event-stream", "Cache-Control": "no-cache"}
        headers.pop("Last-Event-ID", None)
        if self.last_id:
            headers["Last-Event-ID"] = self.last_id
        self._received = 0
        self._decoder = SSEDecoder(last_id=self.last_id, retry_ms=self._decoder.retry_ms)
        self._lines = LineSplitter()
        return replace(self.call, headers=headers)

    def opened(self, response: httpx.Response) -> None:
        """A successful answer ends the failing period (not the backoff: `_failures` stays).
        One that is no event stream (a proxy's login page answering 200) is an APIError: read
        as one, it held no event, and the stream ended as if whole, silently."""
        self._opened = True
        self.headers = response.headers
        if self._failing_since is not None:
            self._failed_s += time.monotonic() - self._failing_since
            self._failing_since = None
        if response.status_code == 204:
            self.done = True
            return
        kind = response.headers.get("Content-Type", "")
        if kind.partition(";")[0].strip().lower() != "text/event-stream":
            message = f"not the producer's answer: {kind or 'no Content-Type'}, not an event stream"
            raise api_error(response.status_code, "invalid_response", message, response.headers)

    def feed_bytes(self, data: bytes) -> list[Event]:
        """The events a piece of the response completes, up to the stream's end."""
        events = []
        for line in self._lines.feed(data):
            if (event := self.feed(line)) is not None:
                events.append(event)
            if self.done:
                break
        return events

    def _reopens(self, error: Exception) -> bool:
        """A resumable stream resumes after any drop. One that is not (a chat completion: a
        second request is a second completion) is only opened again while none of its
        requests was served, and only where none can have run: after a 429 (refused before
        anything ran; a 503 may follow a job already written) or a connection never made. It
        ended at the first, as the same call unstreamed retries them."""
        if self.resumable:
            return True
        if self._opened:
            return False
        return isinstance(error, NEVER_SENT) or (
            isinstance(error, APIError) and error.status == 429
        )

    def feed(self, line: str) -> Event | None:
        event = self._decoder.feed(line)
        if event is not None:
            self._received += 1
            self._failures = self._empty_closes = 0
            self._failed_s = 0.0
            if event.event in TERMINAL_EVENTS or event.data == "[DONE]":
                self.done = True
        return event

    def closed(self) -> float:
        """The server ended the response cleanly; returns the seconds to wait before resuming:
        the server's `retry:`, `reconnect_for_s` at most (a producer that shuts down or lost
        Redis ends each stream with `event: error` and `retry: 1000`; resuming at once met the
        same producer or outage)."""
        self._empty_closes = 0 if self._received else self._empty_closes + 1
        if not self.resumable or self._empty_closes >= 2:
            self.done = True
        return 0.0 if self.done else self._retry_s()

    def _retry_s(self) -> float:
        """The server's `retry:` in seconds (0 without one), `reconnect_for_s` at most, as a
        Retry-After past it is never slept out (`refused`): `retry: 99999999` (ms) held the
        stream silent for days."""
        return min((self._decoder.retry_ms or 0) / 1000.0, self.reconnect_for_s)

    def refused(self, error: APIError) -> float:
        """A resume answered 429 or 503 (Redis still away, the producers busy), or a proxy's
        502 or 504 (the producer behind it restarting): waited out as a dropped connection
        is, at least its Retry-After; any other error ends the stream. It used to end it at
        once, though the server had asked for the resume. A Retry-After that would end past
        `reconnect_for_s` of failing is StreamError at once: slept out whole, a maintenance
        page's `Retry-After: 3600` held the stream silent for the hour."""
        if error.status not in {REFUSED, *UNAVAILABLE} or not self._reopens(error):
            raise error
        pause = self.dropped(error)
        asked = retry_after_s(error.headers)
        if asked is None or asked <= pause:
            return pause
        assert self._failing_since is not None  # `dropped` began the failing period
        failed_s = self._failed_s + time.monotonic() - self._failing_since
        if failed_s + asked > self.reconnect_for_s:
            raise StreamError(
                f"event stream lost: Retry-After {asked:g}s would resume past "
                f"reconnect_for_s ({self.reconnect_for_s:g}s): {error}"
            ) from error
        return asked

    def dropped(self, error: Exception) -> float:
        """Seconds to wait before resuming: full-jitter exponential backoff, at least the
        server's `retry:` (`reconnect_for_s` at most; it alone, unchanging, was every pause
        once sent); StreamError when the stream cannot be reopened or resumes failed for
        `reconnect_for_s` seconds without an event."""
        self._failures += 1
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if not self._reopens(error):
            raise StreamError(f"event stream lost: {error!r}")
        failed_s = self._failed_s + now - self._failing_since
        if failed_s > self.reconnect_for_s:
            raise StreamError(
                f"event stream lost: {self._failures} tries failing for "
                f"{failed_s:.1f}s without an event: {error!r}"
            )
        doublings = min(self._failures, _BACKOFF_DOUBLINGS)
        backoff = random.uniform(0, min(BACKOFF_CAP_S, 0.25 * 2**doublings))
        return max(backoff, self._retry_s())

"""The SDK against small real HTTP servers that answer what a producer answers at its worst: a
503 to a POST (which may follow a job already written: replicas that did not confirm it), and
event data holding characters that JSON carries raw but `str.splitlines` breaks at."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from conveyor.client import (
    APIError,
    AsyncClient,
    Client,
    Conflict,
    RateLimited,
    WaitTimeout,
    calls,
)
from conveyor.client.errors import InvalidArgument, StreamError
from conveyor.client.sse import BACKOFF_CAP_S, EventStream
from conveyor.stack import free_port
from tests.local_http import LocalServer, QuietHandler, serving

SEPARATED = "a\u2028b\u2029c\x85d"  # line and paragraph separators, NEL: legal inside JSON
OUTAGE_S = 3.0  # how long /v1/jobs/outage/events answers its resumes 503
QUIET_S = 1.0  # how long /v1/jobs/quietcut/events stays open, pinged once, before each cut
MOVED_TO = "https://conveyor.example/v1/jobs/moved"  # where /v1/jobs/moved redirects (308)
_ENDED = {"jobs": "succeeded", "batches": "completed"}  # how each ends by itself
_JSON = "application/json"


class _Server(LocalServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.posts: list[tuple[str, str | None]] = []  # (path, Idempotency-Key)
        self.resumed: list[str | None] = []  # Last-Event-ID of each /v1/jobs/cut/events
        self.limited = 0  # GETs of /v1/jobs/limited, each answered 429 with Retry-After: 30
        # paths of cancels (a job's DELETE, a batch's POST): odd ones answered 503, even ones 409
        self.cancels: list[str] = []
        self.outage_since: float | None = None  # the first resume of /v1/jobs/outage/events
        self.predict_timeouts: list[float] = []  # `wait` of each predict of model `slow`
        self.quiet_cuts = 0  # requests of /v1/jobs/quietcut/events


class _Handler(QuietHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        sent = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = {} if self.path == "/v1/files" else json.loads(sent or b"{}")  # a multipart upload
        if self.path.endswith("/cancel"):
            self._cancel()
            return
        if body.get("model") == "slow":
            self._slow_predict()
            return
        if body.get("model") == "cancelled":  # handed off, then cancelled
            self._send(202, json.dumps({"id": "gone", "status": "queued"}).encode(), _JSON)
            return
        self.server.posts.append((self.path.split("?")[0], self.headers.get("Idempotency-Key")))
        if body.get("model") == "busy" and len(self.server.posts) == 1:
            error = {"error": {"type": "rate_limited", "message": "slow down"}}
            self._send(429, json.dumps(error).encode(), "application/json", {"Retry-After": "0"})
            return
        if body.get("model") == "busy":
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "busy"}
            chunk["choices"] = [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]
            events = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            self._send(200, events, "text/event-stream")
            return
        error = {"error": {"type": "unavailable", "message": "replicas did not confirm"}}
        self._send(503, json.dumps(error).encode(), "application/json", {"Retry-After": "0"})

    def do_DELETE(self) -> None:
        self._cancel()

    def _cancel(self) -> None:
        """A cancel that commits but whose answer is lost (503), then the resend's 409; a job
        or batch whose path holds `ended` ended before any cancel: 409 at once."""
        self.server.cancels.append(self.path)
        if len(self.server.cancels) % 2 and "ended" not in self.path:
            error = {"error": {"type": "unavailable", "message": "replicas did not confirm"}}
            self._send(503, json.dumps(error).encode(), "application/json", {"Retry-After": "0"})
            return
        error = {"error": {"type": "conflict", "message": "already cancelled"}}
        self._send(409, json.dumps(error).encode(), "application/json")

    def _slow_predict(self) -> None:
        """A predict refused once (429, `Retry-After: 1`), then waited for its whole `wait`
        before the job is handed off (202, still queued)."""
        if not self.server.predict_timeouts:
            self.server.predict_timeouts.append(-1.0)
            error = {"error": {"type": "rate_limited", "message": "slow down"}}
            self._send(429, json.dumps(error).encode(), _JSON, {"Retry-After": "1"})
            return
        timeout = float(parse_qs(urlsplit(self.path).query)["wait"][0])
        self.server.predict_timeouts.append(timeout)
        time.sleep(timeout)
        self._send(202, json.dumps({"id": "slowjob", "status": "queued"}).encode(), _JSON)

    def do_GET(self) -> None:
        if self._special_get():
            return
        kind, _, name = self.path.removeprefix("/v1/").partition("/")
        if kind in _ENDED and name in ("x", "ended", "done"):
            self._ended(kind, name)
            return
        if self.path.startswith(("/v1/jobs/limited", "/v1/batches/limited")):
            self.server.limited += 1
            error = {"error": {"type": "rate_limited", "message": "slow down"}}
            self._send(429, json.dumps(error).encode(), "application/json", {"Retry-After": "30"})
            return
        if self.path.startswith("/v1/jobs/quiet/"):
            self._quiet()
            return
        if self.path.startswith("/v1/jobs/cut/"):
            self._cut()
            return
        final = {"id": "job-1", "status": "succeeded", "outputs": {"s": SEPARATED}}
        data = json.dumps(final, ensure_ascii=False)  # raw, as orjson writes it
        body = f"id: 1\nevent: final\ndata: {data}\n\n".encode()
        self._send(200, body, "text/event-stream")

    def _special_get(self) -> bool:
        """The answers of the later tests, by path; False for the others."""
        path = urlsplit(self.path).path
        if path.startswith("/v1/jobs/moved"):
            self._send(308, b"", "text/plain", {"Location": MOVED_TO})
        elif path == "/v1/jobs/outage/events":
            self._outage()
        elif path == "/v1/jobs/down/events":
            error = {"error": {"type": "unavailable", "message": "redis unavailable"}}
            self._send(503, json.dumps(error).encode(), _JSON, {"Retry-After": "0"})
        elif path == "/v1/jobs/quietcut/events":
            self._quiet_cut()
        elif path == "/v1/jobs/accept-drop/events":
            self._cut_after(b"", 0.0)
        elif path in ("/v1/jobs/slowjob", "/v1/jobs/gone"):
            view = {"id": path[9:], "status": "queued" if path.endswith("slowjob") else "cancelled"}
            self._send(200, json.dumps(view).encode(), _JSON)
        else:
            return False
        return True

    def _outage(self) -> None:
        """A Redis failover of OUTAGE_S: the stream ends with `event: error` and `retry: 100`,
        every resume is answered 503 until the outage is over, then the rest is served."""
        if self.headers.get("Last-Event-ID") is None:
            body = b"retry: 100\nid: 1\nevent: token\ndata: {}\n\nevent: error\ndata: {}\n\n"
            self._send(200, body, "text/event-stream")
            return
        self.server.outage_since = self.server.outage_since or time.monotonic()
        if time.monotonic() - self.server.outage_since < OUTAGE_S:
            error = {"error": {"type": "unavailable", "message": "redis unavailable"}}
            self._send(503, json.dumps(error).encode(), _JSON, {"Retry-After": "0"})
            return
        self._send(200, b'id: 2\nevent: final\ndata: {"id": "outage"}\n\n', "text/event-stream")

    def _quiet_cut(self) -> None:
        """A quiet job's stream cut twice, each time QUIET_S after it opened (pings only);
        the third connection brings its final event."""
        self.server.quiet_cuts += 1
        if self.server.quiet_cuts <= 2:
            self._cut_after(b": ping\n\n", QUIET_S)
            return
        self._send(200, b'id: 1\nevent: final\ndata: {"id": "quietcut"}\n\n', "text/event-stream")

    def _cut_after(self, ping: bytes, pause_s: float) -> None:
        """A 200 whose chunked body sends `ping`, then after `pause_s` its connection is cut
        without the last chunk: to the client, a dropped stream (httpx's RemoteProtocolError)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if ping:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(ping), ping))
        time.sleep(pause_s)
        self.close_connection = True

    def _ended(self, kind: str, name: str) -> None:
        """What the cancels above find: `done` ended by itself, the others were cancelled."""
        view = {"id": name, "status": "cancelled" if name != "done" else _ENDED[kind]}
        if kind == "batches":
            view |= {"counts": {"total": 1, "succeeded": 0, "failed": 1, "pending": 0}}
            view["created_at"] = 0
        self._send(200, json.dumps(view).encode(), "application/json")

    def _cut(self) -> None:
        """A producer losing Redis: it ends the stream with `event: error` and `retry:`; the
        resume is answered 503 while Redis is away; the one after that serves the rest."""
        self.server.resumed.append(self.headers.get("Last-Event-ID"))
        if len(self.server.resumed) == 2:
            error = {"error": {"type": "unavailable", "message": "redis unavailable"}}
            self._send(503, json.dumps(error).encode(), "application/json", {"Retry-After": "0"})
            return
        events = (
            b"retry: 100\nid: 1\nevent: token\ndata: {}\n\nevent: error\ndata: {}\n\n"
            if len(self.server.resumed) == 1
            else b'id: 2\nevent: final\ndata: {"id": "cut"}\n\n'
        )
        self._send(200, events, "text/event-stream")

    def _quiet(self) -> None:
        """A job that runs quietly: a keep-alive ping 1.5 s in, its final event 1.5 s later."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for chunk in (b": keep-alive\n\n", b'id: 2\nevent: final\ndata: {"id": "quiet"}\n\n'):
            time.sleep(1.5)
            self.wfile.write(chunk)
            self.wfile.flush()

    def _send(self, status: int, body: bytes, kind: str, extra: dict[str, str] | None = None):
        self.answer(status, body, {"Content-Type": kind, **(extra or {})})


@pytest.fixture
def server() -> Iterator[_Server]:
    with serving(_Server()) as running:
        yield running


def test_a_503_to_a_post_without_a_key_is_not_sent_again(server: _Server) -> None:
    """chat and embeddings carry no Idempotency-Key: each 503 was retried, up to six POSTs,
    each of which could enqueue the job once more; nor does an upload, which would be stored
    once more."""
    with Client(server.url) as client:
        for call in (
            lambda: client.chat("m", [{"role": "user", "content": "hi"}]),
            lambda: client.embed("m", ["a"]),
            lambda: client.files.create(b'{"custom_id": "a", "body": {}}\n'),
        ):
            with pytest.raises(APIError) as refused:
                call()
            assert refused.value.status == 503
    assert [path for path, _ in server.posts] == [
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/files",
    ]


def test_a_streamed_chat_is_opened_again_after_a_429_only(server: _Server) -> None:
    """A 429 refused the request before anything ran, as a connection never made sent nothing:
    the streamed chat ended at either, where the same call unstreamed retried. A 503 may follow
    a job already written: not sent again, streamed or not."""
    hello = [{"role": "user", "content": "hi"}]
    with Client(server.url) as client:
        chunks = list(client.chat_stream("busy", hello))
        assert [chunk.choices[0].delta.content for chunk in chunks] == ["hi"]
        assert len(server.posts) == 2
        with pytest.raises(APIError) as refused:
            list(client.chat_stream("m", hello))
    assert refused.value.status == 503 and len(server.posts) == 3
    with Client(f"http://127.0.0.1:{free_port()}") as client:
        call = calls.chat_stream_call("m", hello, {})
        stream = EventStream(call, resumable=False, reconnect_for_s=1)
        with pytest.raises(StreamError, match="without an event"):
            list(client.events(stream))


@pytest.mark.parametrize("create", ["submit", "predict", "batch", "batch_from_file"])
def test_a_503_to_a_keyed_create_is_retried_with_the_same_key(server: _Server, create: str) -> None:
    """A submit, a predict and a batch's create (from lines or an upload) always carry an
    Idempotency-Key (a batch's and a predict's were sent once, without one: a 503 may have
    followed a job already made)."""
    with Client(server.url) as client, pytest.raises(APIError):
        if create == "submit":
            client.submit("m", {"x": 1})
        elif create == "predict":
            client.predict("m", {"x": 1})
        elif create == "batch":
            client.batches.create([{"custom_id": "a", "body": {"inputs": {}}}], model="m")
        else:
            client.batches.create_from_file("file-1", model="m")
    assert len(server.posts) == 6  # the first try and five retries
    assert len({key for _, key in server.posts}) == 1 and server.posts[0][1]


def test_event_data_is_cut_at_line_ends_only(server: _Server) -> None:
    """httpx's iter_lines also breaks at U+2028, U+2029 and U+0085: the event's data was cut
    there, and `json()` of a final event carrying one of them raised."""
    with Client(server.url) as client:
        (final,) = list(client.stream("job-1"))
    assert final.json()["outputs"]["s"] == SEPARATED

    async def stream() -> list[Any]:
        async with AsyncClient(server.url) as client:
            return [event.json() async for event in client.stream("job-1")]

    assert [event["outputs"]["s"] for event in asyncio.run(stream())] == [SEPARATED]


def test_a_quiet_jobs_stream_outlives_the_clients_own_timeout(server: _Server) -> None:
    """The stream read with the client's timeout: with `timeout=1`, every quiet stretch between
    the server's pings cut the stream, and its reconnects ran out (StreamError) on a job that
    was running fine."""
    with Client(server.url, timeout=1) as client:
        (final,) = list(client.stream("quiet"))
    assert (final.event, final.json()) == ("final", {"id": "quiet"})


def test_a_stream_resumes_through_the_outage_that_cut_it(server: _Server) -> None:
    """The server cuts the stream (`event: error`, `retry:`) and answers the resume 503 while
    Redis is away: the 503 ended the stream with an APIError, though the server had asked for
    the resume; and the resume came at once, not after `retry:`."""
    with Client(server.url) as client:
        events = [event.event for event in client.stream("cut")]
    assert events == ["token", "error", "final"]
    assert server.resumed == [None, "1", "1"]


def test_a_wait_does_not_retry_past_its_timeout(server: _Server) -> None:
    """Its retries slept out the server's Retry-After (30 s here, up to 300 s), five times
    over, past the wait's own timeout: `wait(timeout=1)` took minutes. A retry that would start
    past the timeout is not made: the 429 is raised within it."""
    with Client(server.url) as client:
        with pytest.raises(RateLimited):
            client.wait("limited", timeout=1)
        with pytest.raises(RateLimited):
            client.batches.wait("limited", timeout=1)
    assert server.limited == 2  # one each, no retry: the first would have started 30 s in


@pytest.mark.parametrize(("kind", "suffix"), [("jobs", ""), ("batches", "/cancel")])
def test_a_resent_cancel_that_finds_its_own_cancel_returns_what_it_cancelled(
    server: _Server, kind: str, suffix: str
) -> None:
    """The first try cancelled the job (or batch) but its answer was lost (503): the resend's
    409 was raised as Conflict (and `conveyor batch cancel` exited 1), though this very call
    had cancelled it. A 409 to a first try, or to a resend that finds it ended otherwise, is
    still a Conflict."""

    def cancel(client: Client, name: str) -> str:
        return (client.cancel(name) if kind == "jobs" else client.batches.cancel(name)).status

    async def cancel_async(name: str) -> str:
        async with AsyncClient(server.url) as client:
            cancelling = client.cancel(name) if kind == "jobs" else client.batches.cancel(name)
            return (await cancelling).status

    with Client(server.url) as client:
        assert cancel(client, "x") == "cancelled"
        assert asyncio.run(cancel_async("x")) == "cancelled"
        for name in ("done", "ended"):
            with pytest.raises(Conflict):
                cancel(client, name)
            with pytest.raises(Conflict):
                asyncio.run(cancel_async(name))
    paths = [f"/v1/{kind}/{name}{suffix}" for name in ("x", "done", "ended")]
    assert server.cancels == [paths[0]] * 4 + [paths[1]] * 4 + [paths[2]] * 2


def test_a_stream_outlives_an_outage_longer_than_its_retries(server: _Server) -> None:
    """Once the server had sent `retry:`, every resume came after exactly that (no backoff),
    and the ninth 503 in a row ended the stream (StreamError) after about nine `retry:`s: a
    Redis failover of a few seconds ended every stream while its job ran on. Resumes now back
    off (`retry:` the least pause) until no event came for `reconnect_for_s`."""
    with Client(server.url) as client:
        events = [event.event for event in client.stream("outage")]
        assert events == ["token", "error", "final"]
        with pytest.raises(StreamError, match="without an event"):
            list(client.stream("down", reconnect_for_s=0.5))
        with pytest.raises(InvalidArgument):
            client.stream("down", reconnect_for_s=float("nan"))


def test_only_failing_time_counts_toward_reconnect_for_s(server: _Server) -> None:
    """The failing time ran from the first drop after an event, connections that opened fine
    included: a quiet job's stream (pings only) cut at 5 s and again at 150 s raised StreamError
    at the second cut, untried. Only time from a drop to the next open counts; a server that
    accepts each resume and drops it at once still runs `reconnect_for_s` out."""
    with Client(server.url) as client:
        events = [event.event for event in client.stream("quietcut", reconnect_for_s=0.8)]
        assert (events, server.quiet_cuts) == (["final"], 3)
        with pytest.raises(StreamError, match="without an event"):
            list(client.stream("accept-drop", reconnect_for_s=0.2))


def test_the_backoff_stays_capped_however_many_drops() -> None:
    """`0.25 * 2**failures` overflowed a float at the 1024th drop in a row (OverflowError, not
    a pause), which a `reconnect_for_s` of a day or math.inf lets a long outage reach."""
    stream = EventStream(calls.events_call("x", None), reconnect_for_s=math.inf)
    pauses = [stream.dropped(httpx.ConnectError("refused")) for _ in range(1100)]
    assert all(0 <= pause <= BACKOFF_CAP_S for pause in pauses)


def test_a_retried_predict_asks_only_for_the_time_left(server: _Server) -> None:
    """The retry after a 429 resent the first try's `timeout` (and HTTP timeout): a predict of
    3 s refused for 1 s asked the route for 3 s more, and ended past 4 s."""
    with Client(server.url) as client, pytest.raises(WaitTimeout):
        client.predict("slow", {}, timeout=3)
    first, second = server.predict_timeouts
    assert first == -1.0 and 0 < second <= 2.1, server.predict_timeouts


def test_a_redirect_is_an_error_that_names_where_it_leads(server: _Server) -> None:
    """httpx follows no redirect: a 308 (an ingress sending http to https) was read as the
    answer, a JSONDecodeError traceback, or a stream that ended at once with nothing."""
    with Client(server.url) as client:
        with pytest.raises(APIError, match=MOVED_TO) as read:
            client.get("moved")
        with pytest.raises(APIError) as streamed:
            list(client.stream("moved"))
    assert read.value.status == streamed.value.status == 308


def test_a_predict_cancelled_after_its_hand_off_raises_conflict(server: _Server) -> None:
    """A job cancelled within predict's first request raised Conflict (409, by the status
    map), one cancelled after its 202 hand-off a plain APIError(409)."""
    with Client(server.url) as client, pytest.raises(Conflict) as cancelled:
        client.predict("cancelled", {}, timeout=5)
    assert cancelled.value.status == 409

"""The SDK behind what may stand between it and a producer: a proxy answering 502 or 504 (an
HTML page, no JSON) while the producer behind it restarts, a page answering 200 in the
producer's place, a producer host that does not answer a connection. A real HTTP server answers
each request with the next of a script."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from conveyor.client import (
    APIError,
    AsyncClient,
    Client,
    RetryEvent,
    RetryPolicy,
)
from tests.local_http import LocalServer, QuietHandler, serving

JOB = json.dumps({"id": "job-1", "status": "succeeded", "outputs": {"x": 1}}).encode()
BATCH = {"id": "b-1", "status": "completed", "created_at": 1}
BATCH["counts"] = {"total": 1, "succeeded": 1, "failed": 0, "pending": 0}
GATEWAY_PAGE = b"<html><body><h1>502 Bad Gateway</h1>nginx</body></html>"
LOGIN_PAGE = b"<html><body>Sign in to continue</body></html>"
Answer = tuple[int, dict[str, str], bytes]  # status, headers, body
NO_PAUSE = RetryPolicy(base_s=0.0)  # retries at once: these tests count them, not wait them


class _Scripted(LocalServer):
    """Answers request number n with `script[n]` (the last answer once the script ends),
    recording each request's method, path and Last-Event-ID."""

    def __init__(self, script: list[Answer]) -> None:
        super().__init__(_Handler)
        self.script = script
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def next_answer(self, request: str) -> Answer:
        with self.lock:
            self.seen.append(request)
            return self.script[min(len(self.seen), len(self.script)) - 1]


class _Handler(QuietHandler):
    protocol_version = "HTTP/1.1"
    server: _Scripted

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def _answer(self) -> None:
        after = self.headers.get("Last-Event-ID")
        request = f"{self.command} {self.path}" + (f" after {after}" if after else "")
        status, headers, body = self.server.next_answer(request)
        kind = "application/json" if body.startswith(b"{") else "text/html"
        self.answer(status, body, {"Content-Type": kind, **headers})


@pytest.fixture
def scripted(request: pytest.FixtureRequest) -> Iterator[_Scripted]:
    """The server of the test's `script` parameter."""
    with serving(_Scripted(request.param)) as running:
        yield running


@pytest.mark.parametrize(
    "scripted",
    [[(502, {}, GATEWAY_PAGE), (200, {}, JOB)], [(504, {}, b"gateway timeout"), (200, {}, JOB)]],
    indirect=True,
)
def test_a_proxys_gateway_error_to_a_get_is_retried(scripted: _Scripted) -> None:
    """A GET cannot do anything twice: the proxy's 502 (504) while the producer restarts is
    waited out as a 503 is, not raised on the first try."""
    with Client(scripted.url, retry=NO_PAUSE) as client:
        assert client.wait("job-1", timeout=30).status == "succeeded"
    assert len(scripted.seen) == 2


@pytest.mark.parametrize("scripted", [[(502, {}, GATEWAY_PAGE), (200, {}, JOB)]], indirect=True)
def test_async_retries_a_proxys_gateway_error_to_a_get(scripted: _Scripted) -> None:
    async def waited() -> str:
        async with AsyncClient(scripted.url, retry=NO_PAUSE) as client:
            return (await client.get("job-1")).status

    assert asyncio.run(waited()) == "succeeded"
    assert len(scripted.seen) == 2


SSE = {"Content-Type": "text/event-stream"}


@pytest.mark.parametrize(
    "scripted",
    [
        [
            (200, SSE, b"retry: 0\nid: 1\nevent: token\ndata: {}\n\n"),
            (502, {}, GATEWAY_PAGE),
            (200, SSE, b"id: 2\nevent: final\ndata: {}\n\n"),
        ]
    ],
    indirect=True,
)
def test_a_stream_resumes_through_a_proxys_gateway_error(scripted: _Scripted) -> None:
    """A stream cut while the producer restarts behind its proxy is resumed through the proxy's
    502 as through a producer's own 503, from the last event: it ended with the 502."""
    with Client(scripted.url) as client:
        events = [event.id for event in client.stream("job-1")]
    assert events == ["1", "2"]
    path = "GET /v1/jobs/job-1/events"
    assert scripted.seen == [path, f"{path} after 1", f"{path} after 1"]


@pytest.mark.parametrize(
    "scripted",
    [[(200, SSE, "retry: \u00b2\nid: 1\nevent: final\ndata: {}\n\n".encode())]],
    indirect=True,
)
def test_a_retry_field_that_is_not_ascii_digits_is_ignored(scripted: _Scripted) -> None:
    """The spec's `retry:` is ASCII digits; `²` passed `isdigit` and raised ValueError."""
    with Client(scripted.url) as client:
        assert [event.id for event in client.stream("job-1")] == ["1"]


@pytest.mark.parametrize("scripted", [[(502, {}, GATEWAY_PAGE), (200, {}, JOB)]], indirect=True)
def test_a_gateway_error_to_a_post_without_a_key_is_raised_with_the_page(
    scripted: _Scripted,
) -> None:
    """A chat (no Idempotency-Key) may have reached the producer before its proxy failed: one
    try, and the proxy's page is the error's message, not a JSONDecodeError."""
    with Client(scripted.url, retry=NO_PAUSE) as client, pytest.raises(APIError) as raised:
        client.chat("smollm2", [{"role": "user", "content": "hi"}])
    assert (raised.value.status, raised.value.type) == (502, "http_error")
    assert "502 Bad Gateway" in raised.value.message
    assert scripted.seen == ["POST /v1/chat/completions"]


@pytest.mark.parametrize(
    "scripted",
    [[(502, {"x-should-retry": "false"}, b'{"error": {"type": "bad_model_output"}}')]],
    indirect=True,
)
def test_an_answer_that_says_not_to_retry_is_raised_at_once(scripted: _Scripted) -> None:
    with Client(scripted.url, retry=NO_PAUSE) as client, pytest.raises(APIError) as raised:
        client.get("job-1")
    assert raised.value.status == 502
    assert len(scripted.seen) == 1


LIMITED = b'{"error": {"type": "rate_limited", "message": "slow down"}}'


@pytest.mark.parametrize(
    ("scripted", "asked"),
    [
        ([(429, {"Retry-After": "0.2"}, LIMITED), (200, {}, JOB)], 0.2),
        ([(429, {"Retry-After": "\u00b2"}, LIMITED), (200, {}, JOB)], None),  # no number
        ([(429, {"Retry-After": "nan"}, LIMITED), (200, {}, JOB)], None),
    ],
    indirect=["scripted"],
)
def test_retry_after_with_a_fraction_is_honoured_and_junk_ignored(
    scripted: _Scripted, asked: float | None
) -> None:
    """`Retry-After: 0.2` is waited (it was ignored for the backoff); one that is no number
    falls back to the backoff (`²` raised ValueError out of the call)."""
    retries: list[RetryEvent] = []
    with Client(scripted.url, retry=NO_PAUSE, on_retry=retries.append) as client:
        assert client.get("job-1").status == "succeeded"
    assert [retry.retry_after_s for retry in retries] == [asked]


@pytest.mark.parametrize("scripted", [[(200, {}, LOGIN_PAGE)]], indirect=True)
def test_a_page_answering_in_the_producers_place_is_an_api_error(scripted: _Scripted) -> None:
    """A 200 that is not the producer's JSON (a captive portal, another service at the URL)
    is an APIError saying so, for the sync and the async client alike."""

    async def read() -> None:
        async with AsyncClient(scripted.url) as client:
            await client.get("job-1")

    with Client(scripted.url) as client, pytest.raises(APIError) as raised:
        client.get("job-1")
    with pytest.raises(APIError) as raised_async:
        asyncio.run(read())
    for error in (raised.value, raised_async.value):
        assert (error.status, error.type) == (200, "invalid_response")
        assert "Sign in to continue" in error.message


@pytest.mark.parametrize("scripted", [[(200, {}, LOGIN_PAGE)]], indirect=True)
def test_a_page_where_an_event_stream_was_asked_for_is_an_api_error(scripted: _Scripted) -> None:
    """A job's events and a streamed chat: the page held no event, and each stream ended at
    once as if whole, with nothing raised."""

    async def chunks() -> None:
        async with AsyncClient(scripted.url) as client:
            async for _ in client.chat_stream("smollm2", [{"role": "user", "content": "hi"}]):
                pass

    with Client(scripted.url) as client, pytest.raises(APIError) as raised:
        list(client.stream("job-1"))
    with pytest.raises(APIError) as raised_async:
        asyncio.run(chunks())
    for error in (raised.value, raised_async.value):
        assert (error.status, error.type) == (200, "invalid_response")
        assert "text/html" in error.message
    assert len(scripted.seen) == 2  # neither opened again


@pytest.mark.parametrize(
    "scripted",
    [[(200, {}, b'{"status": "ok"}'), (200, {}, json.dumps(BATCH).encode())]],
    indirect=True,
)
def test_json_that_is_not_the_answer_asked_for_is_an_api_error(scripted: _Scripted) -> None:
    """JSON of another shape (another service's health answer) too, not pydantic's
    ValidationError; and a batch's results whose lines are not JSON lines."""
    with Client(scripted.url) as client:
        with pytest.raises(APIError, match="invalid_response"):
            client.get("job-1")
        with pytest.raises(APIError, match="invalid_response"):
            client.batches.results("b-1")


@pytest.mark.parametrize("scripted", [[(200, {}, JOB)]], indirect=True)
def test_a_calls_long_timeout_leaves_the_connect_timeout_the_clients(scripted: _Scripted) -> None:
    """A long-poll (`wait`) and a completion may take minutes to answer, but a producer that
    does not accept the connection is given up on within the client's own timeout: a chat
    waited 600 s for a connection, six tries over."""
    sent: list[dict[str, float | None]] = []

    def record(request: httpx.Request) -> None:
        sent.append(request.extensions["timeout"])

    with Client(scripted.url, timeout=5.0) as client:
        client.http.event_hooks["request"].append(record)
        client.wait("job-1")
        with pytest.raises(APIError):  # the job is no completion
            client.chat("smollm2", [{"role": "user", "content": "hi"}])
    waited, chatted = sent
    assert (waited["connect"], waited["pool"]) == (5.0, 5.0)
    assert waited["read"] is not None and waited["read"] > 30  # the long-poll's 30 s and slack
    assert (chatted["connect"], chatted["pool"], chatted["read"]) == (5.0, 5.0, 600)

"""The SDK at a server's edges: a `Retry-After` date with no zone (HTTP's dates are all GMT) or
a number that is no delay-seconds, a streamed chat's chunk that is not one, a cancelled predict
whose job cannot be cancelled within ABANDON_S, and a retry policy's thousandth backoff."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from conveyor.client import APIError, AsyncClient, calls
from conveyor.client.retries import RetryPolicy, retry_after_s
from conveyor.client.types import Event
from tests.local_http import LocalServer, QuietHandler, serving


def _asked(value: str | bytes) -> float | None:
    return retry_after_s(httpx.Headers([(b"Retry-After", _bytes(value))]))


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def test_an_http_date_with_no_zone_is_gmt(monkeypatch: pytest.MonkeyPatch) -> None:
    """asctime's and `-0000` dates name no zone, yet are GMT (RFC 9110): read as the host's
    local time, an hour's Retry-After was six on a host five hours behind GMT, or none at all
    on one ahead of it."""
    monkeypatch.setenv("TZ", "EST5")
    time.tzset()
    try:
        when = time.gmtime(time.time() + 3600)
        asctime = _asked(time.strftime("%a %b %d %H:%M:%S %Y", when))
        unzoned = _asked(time.strftime("%a, %d %b %Y %H:%M:%S -0000", when))
    finally:
        monkeypatch.undo()
        time.tzset()
    for asked in (asctime, unzoned):
        assert asked is not None and 3000 < asked <= 3600


@pytest.mark.parametrize("value", ["1_000", "1e3", "+5", "\uff13".encode(), "\u0663".encode()])
def test_a_retry_after_that_is_no_delay_seconds_is_ignored(value: str | bytes) -> None:
    """Delay-seconds are ASCII digits (a fraction allowed, as `0.5`): `float` also read `1_000`,
    `1e3` and other scripts' digits (fullwidth, Arabic-Indic) as numbers of seconds."""
    assert _asked(value) is None


def test_a_retry_after_of_digits_is_read() -> None:
    assert (_asked("7"), _asked("0.5")) == (7.0, 0.5)


@pytest.mark.parametrize("data", ["<html>502 Bad Gateway</html>", '{"object": "page"}', "[1]"])
def test_a_chat_chunk_that_is_none_is_an_api_error(data: str) -> None:
    """A chunk that is not JSON, or not a chunk (a proxy's page inside the stream), raised
    orjson's JSONDecodeError or pydantic's ValidationError, which no `except APIError` caught;
    a whole answer that is not the producer's is `invalid_response`, and so is it."""
    with pytest.raises(APIError) as raised:
        calls.chat_chunk(Event(id=None, event="message", data=data))
    assert (raised.value.status, raised.value.type) == (200, "invalid_response")
    assert data[:20] in raised.value.message


class _Hanging(QuietHandler):
    """A producer that takes every submit and answers none, until the test ends."""

    released = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.released.wait(5)


@pytest.fixture
def hanging() -> Iterator[LocalServer]:
    _Hanging.released.clear()
    with serving(LocalServer(_Hanging)) as server:
        yield server
        _Hanging.released.set()


async def test_an_abandon_past_abandon_s_leaves_no_task(
    hanging: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled predict's cancel that is not done within ABANDON_S is given up on: its
    task ran on in the background, its request held open for the client's whole timeout."""
    monkeypatch.setattr(calls, "ABANDON_S", 0.2)
    before = asyncio.all_tasks()  # the session's loop runs other tests' background tasks too
    async with AsyncClient(hanging.url) as client:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.predict("m", {"x": 1}), 0.2)
        assert asyncio.all_tasks() - before == set()


def test_a_thousandth_retry_backs_off_no_longer_than_the_cap() -> None:
    """`base_s * 2**attempt` overflowed a float at the 1024th retry, which a policy of short
    pauses (`cap_s=0.01`) reaches within seconds: OverflowError, no SDK error, ended the call."""
    policy = RetryPolicy(max_retries=2000, base_s=0.001, cap_s=0.01)
    pause = policy.after_error(1024, httpx.ConnectError("refused"), repeatable=False)
    assert pause is not None and 0 <= pause.delay_s <= 0.01

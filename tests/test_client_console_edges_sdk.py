"""The SDK's edges: a client timeout no request can be sent with, or a base URL no path can be
joined to, is refused when the client is made. `Client(timeout=0)` failed every call as an
outage ("cannot reach the producer", after every retry's backoff) though the producer was up; a
negative or NaN one raised socket's bare ValueError, an infinite one an OverflowError, at the
first call. A base URL with a query or fragment (`http://host:8000/?`) sent every call to its
own path, the call's path in its query: `get` read the producer's root page as a job. And a
delete resent after its answer was lost is not a NotFound for the file it deleted."""

from __future__ import annotations

import json
import math

import pytest

from conveyor.client import AsyncClient, Client, InvalidArgument, RetryPolicy
from tests.local_http import LocalServer, QuietHandler, serving

URL = "http://127.0.0.1:9"  # never reached: the client is refused before any request


@pytest.mark.parametrize("timeout", [0.0, -1.0, math.nan, math.inf])
@pytest.mark.parametrize("kind", [Client, AsyncClient])
def test_a_timeout_no_request_can_use_is_refused_when_made(
    kind: type[Client] | type[AsyncClient], timeout: float
) -> None:
    with pytest.raises(InvalidArgument, match="timeout"):
        kind(URL, timeout=timeout)


def test_a_positive_timeout_is_kept() -> None:
    with Client(URL, timeout=0.25) as client:
        assert client.http.timeout.connect == 0.25


class _Paths(QuietHandler):
    """Answers every GET with a queued job, noting the path asked for."""

    paths: list[str] = []

    def do_GET(self) -> None:
        self.paths.append(self.path)
        job = {"id": "j", "status": "queued", "model": "m"}
        self.answer(200, json.dumps(job).encode(), {"Content-Type": "application/json"})


def test_a_base_url_keeps_its_path_prefix_and_refuses_a_query() -> None:
    with serving(LocalServer(_Paths)) as server:
        for base in (f"{server.url}/conveyor/", f"{server.url}/conveyor"):
            with Client(base) as client:
                client.get("j")
        for odd in (f"{server.url}/?", f"{server.url}/conveyor?x=1", f"{server.url}/#top"):
            with pytest.raises(ValueError, match="query or fragment"):
                Client(odd)
    assert _Paths.paths == ["/conveyor/v1/jobs/j"] * 2


class _LosesTheFirstDelete(QuietHandler):
    """Deletes the file at the first DELETE but closes the connection unanswered; the file is
    then gone (404), as the producer answers."""

    deletes = 0

    def do_DELETE(self) -> None:
        type(self).deletes += 1
        if type(self).deletes == 1:
            self.close_connection = True
            return
        body = b'{"error": {"type": "not_found", "message": "file file-x not found"}}'
        self.answer(404, body, {"Content-Type": "application/json"})


def test_a_delete_whose_answer_was_lost_is_not_a_not_found() -> None:
    """A resend of a delete whose first try deleted the file, its answer lost, met the file
    gone: NotFound, for a file the call deleted."""
    with (
        serving(LocalServer(_LosesTheFirstDelete)) as server,
        Client(server.url, retry=RetryPolicy(base_s=0.01)) as client,
    ):
        deleted = client.files.delete("file-x")
    assert (deleted.id, deleted.deleted, _LosesTheFirstDelete.deletes) == ("file-x", True, 2)

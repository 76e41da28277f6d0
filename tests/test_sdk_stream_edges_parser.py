"""The SDK's event-stream parsing against the WHATWG rules a server or a proxy may lean on: the
stream is UTF-8 whatever charset its Content-Type names, one leading BOM is not part of the
first field's name, and an empty `id:` resets the resume point (no `Last-Event-ID` is sent)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conveyor.client import Client, calls
from conveyor.client.sse import EventStream
from tests.local_http import LocalServer, QuietHandler, serving

# A final event ends the stream, so one connection serves each test.
_BODY = '\ufeffid: 1-1\ndata: {"text": "café ✓"}\n\nevent: final\ndata: {}\n\n'


class _Latin1Labelled(QuietHandler):
    """An event stream sent in UTF-8, with a BOM, under a Content-Type that names another
    charset (as a proxy may relabel it)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        headers = {"Content-Type": "text/event-stream; charset=iso-8859-1"}
        self.answer(200, _BODY.encode(), headers)


@pytest.fixture
def latin1_labelled() -> Iterator[LocalServer]:
    with serving(LocalServer(_Latin1Labelled)) as server:
        yield server


def test_an_event_stream_is_utf8_and_its_bom_is_dropped(latin1_labelled: LocalServer) -> None:
    """Decoded by its label, the text read `cafÃ©`; the BOM made the first line's field
    `\\ufeffid`, so the event had no id and a resume started the job's stream over."""
    with Client(latin1_labelled.url) as client:
        first, final = list(client.stream("j"))
    assert first.id == "1-1"
    assert first.json() == {"text": "café ✓"}
    assert (final.event, final.id) == ("final", "1-1")


@pytest.mark.parametrize("resumed_from", [None, "1-1"])
def test_an_empty_id_sends_no_last_event_id(resumed_from: str | None) -> None:
    """The spec's empty `id:` resets the last event id, and an empty one is never sent: it was
    sent as `Last-Event-ID: ` (the producer's 422, which ended the stream), or the id the
    stream was first opened with was sent again."""
    stream = EventStream(calls.events_call("j", resumed_from))
    stream.next_call()
    for line in ("id: 1-2", "data: {}", "", "id", "data: {}", ""):
        stream.feed(line)
    assert stream.last_id == ""
    assert "Last-Event-ID" not in stream.next_call().headers

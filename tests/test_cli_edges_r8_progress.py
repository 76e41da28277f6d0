"""`jobs wait`'s progress on a pipe or a log is one line per change, whole: rich wrapped it at
80 columns, so the line a scaling event makes came out as two and a `grep queued:` saw half."""

from __future__ import annotations

import json

import pytest

from conveyor.client import Event
from conveyor.commands.jobs import NO_WORKER, Progress, _progress_line


def test_each_progress_line_reaches_a_pipe_whole(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress()
    events = [
        Event(None, "scaling", json.dumps({"warming": False})),
        Event(None, "queued", json.dumps({"queue_position": 1234567, "eta_ms": None})),
    ]
    lines = [line for event in events if (line := progress.line(event)) is not None]
    assert len(lines[1]) > 80  # past rich's width for a console that is no terminal

    with _progress_line() as show:
        for line in lines:
            show(line)

    assert capsys.readouterr().err.splitlines() == lines
    assert lines[1] == f"queued: 1234567 ahead; {NO_WORKER}"
